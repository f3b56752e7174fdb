"""Dynamic MIG (`packing.modes.mig_dynamic`): a GPU lists every placement its geometry allows, and a grant takes
one beside the held ones. Random runs of allocate/release on A100-80GB GPUs checked against the catalog's own
list of valid layouts (`packing.catalog.all_layouts`), which knows nothing of the mode's search."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from packing import fit
from packing.catalog import GpuModel, all_layouts, validate_layout
from packing.catalog.types import Placement
from packing.model import Assignment, Gpu, GpuGrant, Isolation, MigInstance, Mode, Node, PodDemand
from packing.modes import rules_for
from packing.modes.mig_dynamic import MIG_DYNAMIC, placements_for
from packing.place import schedule_one
from packing.policies import get_policy
from packing.state import ClusterState, PlacementError
from packing.usage import GpuUsage
from tests.core_strategies import CATALOG, TENANTS

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
A100 = CATALOG.get("A100-80GB")
assert A100 is not None and A100.mig is not None
PLACEMENTS = placements_for(A100)
VRAMS = (1024, 9000, 9728, 12000, 19968, 25000, 40192, 50000, 80896, 81000)


def dynamic_gpu(index: int, model: GpuModel = A100, mig: tuple[MigInstance, ...] | None = None) -> Gpu:
    return Gpu(index, model.memory_mib, Mode.MIG_DYNAMIC, product="NVIDIA-A100-SXM4-80GB", model=model.name,
               mig=placements_for(model) if mig is None else mig)


def one_node(gpus: int = 1) -> ClusterState:
    return ClusterState([Node("n", tuple(dynamic_gpu(i) for i in range(gpus)))])


def pod(key: str, vram: int, tenant: str = "team-a") -> PodDemand:
    return PodDemand(key, vram, tenant=tenant, isolation=Isolation.HARDWARE)


def grant(state: ClusterState, key: str, ref: str, vram: int = 1024, index: int = 0) -> None:
    state.allocate(pod(key, vram), Assignment("n", (GpuGrant(index, vram, mig=ref),)))


# ------------------------------------------------------------------------------------------ the truth
def held_of(state: ClusterState, gu: GpuUsage) -> list[MigInstance]:
    """The held placements, read from the holders (not the books)."""
    refs = [g.mig for h in state.holders() for g in h.assignment.gpus if g.index == gu.gpu.index]
    out = [gu.gpu.instance(r or "") for r in refs]
    assert all(i is not None for i in out), refs
    return [i for i in out if i is not None]


def extensions(held: list[MigInstance]) -> list[list[MigInstance]]:
    """Every set of placements that may be created beside `held`: the rest of each valid layout holding it."""
    by_ref = {i.ref: i for i in PLACEMENTS}
    refs = {i.ref for i in held}
    return [[by_ref[p.ref] for p in layout if p.ref not in refs]
            for layout in all_layouts(A100) if refs <= {p.ref for p in layout}]


def check_gpu(state: ClusterState, gu: GpuUsage) -> None:
    held = held_of(state, gu)
    for a, x in enumerate(held):  # never two overlapping placements
        for y in held[:a]:
            assert x.start + x.memory_slices <= y.start or y.start + y.memory_slices <= x.start, (x.ref, y.ref)
    assert sum(i.compute_slices for i in held) <= A100.mig.compute_slices  # type: ignore[union-attr]
    assert not validate_layout(A100, [Placement(i.profile, i.start) for i in held])
    ext = extensions(held)
    assert ext, "the held placements are no valid layout"
    free = {i.ref for e in ext for i in e}
    reach = max(sum(i.memory_mib for i in e) for e in ext)
    waste = sum(i.memory_mib - g.vram_mib for i, g in zip(held, [
        g for h in state.holders() for g in h.assignment.gpus if g.index == gu.gpu.index], strict=True))
    # Free VRAM is what placements can still give, and what they cannot is stranded.
    assert gu.pool_free() - (gu.stranded_mib() - waste if gu.grants else 0) == reach
    assert gu.unit_max() == max((i.memory_mib for i in PLACEMENTS if i.ref in free), default=0)
    assert gu.slots_free() == max(len(e) for e in ext)
    units = MIG_DYNAMIC.free_units(gu)  # what the solvers count as independent units: one valid extension
    assert any({i.ref for i in units} <= {i.ref for i in e} for e in ext)
    assert max((i.memory_mib for i in units), default=0) == gu.unit_max()
    for v in VRAMS:
        want = any(i.memory_mib >= v for i in PLACEMENTS if i.ref in free)
        row = state.index_of("n")
        now = fit.feasible(state, pod("ns/probe", v)).gpu_ok[row, gu.gpu.index]
        assert bool(now) == want, (v, [i.ref for i in held])
        offer, unit, why = MIG_DYNAMIC.candidate(gu, pod("ns/probe", v))
        assert (offer is not None) == want, why
        if offer is not None:  # the smallest free placement that fits
            assert offer.mig in free and unit == min(i.memory_mib for i in PLACEMENTS
                                                    if i.ref in free and i.memory_mib >= v)


# ------------------------------------------------------------------------------------------- the tests
def test_placements_are_every_profile_at_every_allowed_start() -> None:
    geo = A100.mig
    assert geo is not None
    assert len(PLACEMENTS) == sum(len(p.allowed_starts) for p in geo.profiles.values()) == 25
    assert len({i.ref for i in PLACEMENTS}) == len(PLACEMENTS)
    for inst in PLACEMENTS:
        prof = geo.profile(inst.profile)
        assert prof is not None and not validate_layout(A100, [Placement(inst.profile, inst.start)])
        assert (inst.memory_slices, inst.compute_slices, inst.memory_mib) == (
            prof.memory_slices, prof.compute_slices, prof.memory_mib)
    assert placements_for(GpuModel("plain", 16384, None, ())) == ()
    assert rules_for(dynamic_gpu(0)) is MIG_DYNAMIC


@given(data=st.data())
@SETTINGS
def test_random_allocate_release_keeps_the_geometry(data: st.DataObject) -> None:
    state = one_node(gpus=data.draw(st.integers(1, 2)))
    for step in range(data.draw(st.integers(1, 16))):
        held = [h.pod.key for h in state.holders()]
        if held and data.draw(st.integers(0, 3)) == 0:
            assert state.release(data.draw(st.sampled_from(held))) is not None
        else:
            gu = data.draw(st.sampled_from(state.usage("n").gpus))
            p = pod(f"ns/pod-{step}", data.draw(st.sampled_from(VRAMS)), data.draw(st.sampled_from(TENANTS)))
            if data.draw(st.booleans()):
                g = MIG_DYNAMIC.candidate(gu, p)[0]
            else:
                g = GpuGrant(gu.gpu.index, p.vram_mib, mig=data.draw(st.sampled_from(PLACEMENTS)).ref)
            if g is not None:
                try:
                    state.allocate(p, Assignment("n", (g,)))
                except PlacementError:
                    pass
        for gu in state.usage("n").gpus:
            check_gpu(state, gu)
    for h in state.holders():
        state.release(h.pod.key)
    assert state.stranded_mib() == 0
    assert all(gu.unit_max() == 80896 and gu.slots_free() == 7 for gu in state.usage("n").gpus)


def test_overlap_compute_and_media_engines_refuse() -> None:
    state = one_node()
    grant(state, "ns/a", "3g.40gb@4")
    for ref, why in (("7g.80gb@0", "overlaps held placement 3g.40gb@4"), ("1g.10gb@5", "overlaps"),
                     ("3g.40gb@4", "is held by ns/a")):
        try:
            grant(state, "ns/b", ref)
            raise AssertionError(f"{ref} booked")
        except PlacementError as err:
            assert why in str(err)
    grant(state, "ns/b", "1g.10gb+me@0")
    try:
        grant(state, "ns/c", "1g.10gb+me@1")
        raise AssertionError("a second +me booked")
    except PlacementError as err:
        assert "media engines" in str(err)
    # A forced record (a pod already running) is checked for overlap only.
    try:
        state.allocate(pod("ns/d", 1024), Assignment("n", (GpuGrant(0, 1024, mig="4g.40gb@0"),)), force=True)
        raise AssertionError("forced overlap booked")
    except PlacementError as err:
        assert "overlaps held placement 1g.10gb+me@0" in str(err)
    # Compute: a geometry whose slices outlast its compute.
    whole = MigInstance("4g.all", 0, 4, 4, 40000)
    halves = (MigInstance("3g.half", 0, 2, 3, 20000), MigInstance("3g.half", 2, 2, 3, 20000))
    tight = ClusterState([Node("n", (Gpu(0, 40960, Mode.MIG_DYNAMIC, mig=(whole, *halves)),))])
    grant(tight, "ns/a", "3g.half@0")
    gu = tight.usage("n").gpus[0]
    assert (gu.unit_max(), gu.slots_free(), gu.pool_free(), gu.stranded_mib()) == (0, 0, 20000, 20000 + 20000 - 1024)
    try:
        grant(tight, "ns/b", "3g.half@2")
        raise AssertionError("compute over-booked")
    except PlacementError as err:
        assert "1 of 4 free" in str(err)


def test_candidate_is_the_smallest_placement_that_keeps_the_most() -> None:
    state = one_node()
    gu = state.usage("n").gpus[0]
    first = MIG_DYNAMIC.candidate(gu, pod("ns/x", 9000))[0]
    assert first is not None and first.mig == "1g.10gb@0"  # at the edge: 3g@4 + 2g@2 + 1g@1 still fit
    assert MIG_DYNAMIC.candidate(gu, pod("ns/x", 15000))[0].mig == "1g.20gb@0"  # type: ignore[union-attr]
    assert MIG_DYNAMIC.candidate(gu, pod("ns/x", 30000))[0].mig == "3g.40gb@0"  # type: ignore[union-attr]
    grant(state, "ns/a", "1g.10gb@6")  # slice 7 can no longer be used: stranded
    assert gu.stranded_mib() == (80896 - 9728 - 60160) + 9728 - 1024
    assert MIG_DYNAMIC.candidate(gu, pod("ns/x", 50000))[0] is None
    assert MIG_DYNAMIC.candidate(gu, pod("ns/x", 30000))[0].mig == "3g.40gb@0"  # type: ignore[union-attr]


def test_the_default_policy_places_on_a_dynamic_gpu() -> None:
    state = one_node(gpus=2)
    policy = get_policy("vramfit")
    placed = 0
    for step, v in enumerate([30000, 30000, 9000, 9000, 15000, 70000, 9000, 9000]):
        decision = schedule_one(state, pod(f"ns/p{step}", v), policy)
        placed += decision.node is not None
        for gu in state.usage("n").gpus:
            check_gpu(state, gu)
    assert placed >= 7
