"""The conformance suite every sharing mode (`packing.modes`: one `ModeRules` each) passes.

The modes are found by walking the `packing.modes` package for `ModeRules` instances, so a new mode runs
here without being named, and `test_every_sharing_mode_runs_the_conformance_suite` fails if one is found
that `rules_for` never hands out (or the reverse). Each mode gets GPUs of its own (any catalog model, any
replica count or MIG layout that `rules_for` maps to it; an instanced mode whose `layout_for(model)` names
the instances lists those), a random history of grants offered straight to
`ClusterState.allocate` (the mode's own offer, plain grants, MIG instances held or free, a bogus instance,
whole-GPU grants) and releases, and the checks below after every step.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterator
from dataclasses import dataclass, replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import packing.modes
from packing import fit
from packing.model import Assignment, Gpu, GpuGrant, Isolation, MigInstance, Mode, Node, PodDemand
from packing.modes import ALLOWED_MODES, SHARED_MODES, WHOLE_GPU, ModeRules, group_allows, rules_for
from packing.state import ClusterState, PlacementError
from packing.usage import GpuUsage
from tests.core_strategies import CATALOG, MODELS, PRODUCTS, TENANTS, VRAMS, mig_layouts

SETTINGS = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
REPLICAS = (None, 1, 2, 3, 4, 7, 8)  # every replica count a GPU of any mode may report (None: not set)
BOGUS_MIG = "9g.99gb@0"  # an instance no catalog GPU has


def all_mode_rules() -> list[ModeRules]:
    """Every `ModeRules` instance the modules of `packing.modes` define."""
    found: dict[int, ModeRules] = {}
    for info in pkgutil.iter_modules(packing.modes.__path__):
        module = importlib.import_module(f"packing.modes.{info.name}")
        for value in vars(module).values():
            if isinstance(value, ModeRules):
                found[id(value)] = value
    return sorted(found.values(), key=lambda r: r.name)


def _sample_gpu(mode: Mode, replicas: int | None) -> Gpu:
    name = MODELS[0]  # the model and the MIG layout do not decide the rules
    return Gpu(0, CATALOG.get(name).memory_mib, mode, product=PRODUCTS[name], model=name,  # type: ignore[union-attr]
               replicas=replicas)


def configs_by_rules() -> dict[int, list[tuple[Mode, int | None]]]:
    """id(rules) -> the (mode, replicas) a GPU reports to be handed those rules."""
    out: dict[int, list[tuple[Mode, int | None]]] = {}
    for mode in Mode:
        for replicas in REPLICAS:
            try:
                rules = rules_for(_sample_gpu(mode, replicas))
            except (KeyError, ValueError, AssertionError):
                continue
            out.setdefault(id(rules), []).append((mode, replicas))
    return out


MODE_RULES = all_mode_rules()
CONFIGS = configs_by_rules()
by_name = pytest.mark.parametrize("rules", MODE_RULES, ids=[r.name for r in MODE_RULES])


def test_every_sharing_mode_runs_the_conformance_suite() -> None:
    """A mode module `rules_for` never hands out is dead; rules it hands out that no module defines, or a
    GPU mode it has no rules for, would run unchecked here."""
    defined = {id(r): r.name for r in MODE_RULES}
    assert set(CONFIGS) == set(defined), (
        f"defined in packing.modes: {sorted(defined.values())}; handed out by rules_for: "
        f"{sorted(r.name for r in MODE_RULES if id(r) in CONFIGS)} (+{len(set(CONFIGS) - set(defined))} undefined)")
    served = {mode for configs in CONFIGS.values() for mode, _ in configs}
    assert served == set(Mode), f"no rules for {set(Mode) - served}"
    assert len({r.name for r in MODE_RULES}) == len(MODE_RULES), "two modes share a name"


# ---------------------------------------------------------------------------------------------- strategies
@st.composite
def gpus_of(draw: st.DrawFn, rules: ModeRules, index: int) -> Gpu:
    name = draw(st.sampled_from(MODELS))
    mode, replicas = draw(st.sampled_from(CONFIGS[id(rules)]))
    mig = draw(example_layout(rules, name)) if rules.instanced else ()
    gpu = Gpu(index, CATALOG.get(name).memory_mib, mode, product=PRODUCTS[name], model=name,  # type: ignore[union-attr]
              replicas=replicas, mig=mig)
    assert rules_for(gpu) is rules
    return gpu


def example_layout(rules: ModeRules, name: str) -> st.SearchStrategy[tuple[MigInstance, ...]]:
    """The instances of a GPU of catalog model `name` under `rules`: the mode's own (`layout_for(model)`, e.g.
    every placement of dynamic MIG, sometimes only some of them, as where a GPU publishes part), else a
    valid static layout."""
    model = CATALOG.get(name)
    assert model is not None
    every = rules.layout_for(model)
    if every is None:
        return mig_layouts(name)
    some = st.lists(st.sampled_from(every), unique=True).map(lambda xs: tuple(x for x in every if x in xs))
    return st.just(every) | some if every else st.just(every)


@st.composite
def clusters_of(draw: st.DrawFn, rules: ModeRules) -> list[Node]:
    return [Node(f"node-{n}", tuple(draw(gpus_of(rules, i)) for i in range(draw(st.integers(1, 3)))))
            for n in range(draw(st.integers(1, 2)))]


def isolations_for(mode: Mode) -> list[Isolation]:
    return [iso for iso in Isolation if mode in ALLOWED_MODES[iso]]


def grants_for(gu: GpuUsage, vram_mib: int, whole: bool = False) -> list[GpuGrant]:
    """Every grant a pod of `vram_mib` could be given on this GPU: plain, or one per MIG instance."""
    if whole:
        return [GpuGrant(gu.gpu.index, vram_mib, whole=True)]
    return ([GpuGrant(gu.gpu.index, vram_mib)]
            + [GpuGrant(gu.gpu.index, vram_mib, mig=inst.ref) for inst in gu.gpu.mig])


def accepts(state: ClusterState, node: str, pod: PodDemand, grant: GpuGrant) -> bool:
    """What `allocate` decides (`check` is its whole verdict, without booking)."""
    try:
        state.check(pod, Assignment(node, (grant,)))
    except PlacementError:
        return False
    return True


def owner_or(gu: GpuUsage, tenant: str) -> str:
    return next(iter(gu.tenants)) if gu.tenants else tenant


@dataclass
class Attempt:
    """One grant offered to `allocate`; `apply()` offers it (once) and says whether it was booked."""

    state: ClusterState
    node: str
    gu: GpuUsage
    pod: PodDemand
    grant: GpuGrant
    accepted: bool | None = None

    def apply(self) -> bool:
        if self.accepted is None:
            try:
                self.state.allocate(self.pod, Assignment(self.node, (self.grant,)))
                self.accepted = True
            except PlacementError:
                self.accepted = False
        return self.accepted


def history(data: st.DataObject, rules: ModeRules, relax: bool | None = None) -> Iterator[Attempt]:
    """A random run of grants and releases on GPUs of `rules`; yields each grant before it is offered."""
    relax = data.draw(st.booleans()) if relax is None else relax
    state = ClusterState(data.draw(clusters_of(rules)), relax_tenancy=relax)
    for step in range(data.draw(st.integers(1, 14))):
        held = [h.pod.key for h in state.holders()]
        if held and data.draw(st.integers(0, 3)) == 0:
            assert state.release(data.draw(st.sampled_from(held))) is not None
        node = data.draw(st.sampled_from(state.node_names))
        gu = data.draw(st.sampled_from(state.usage(node).gpus))
        um = gu.unit_max()
        vram = data.draw(st.sampled_from(VRAMS) | st.sampled_from([max(1, um), um + 1, max(1, um // 3)]))
        pod = PodDemand(f"ns/pod-{step}", vram, tenant=data.draw(st.sampled_from(TENANTS)),
                        isolation=data.draw(st.sampled_from(isolations_for(gu.gpu.mode))))
        kind = data.draw(st.sampled_from(["offer", "offer", "plain", "instance", "bogus", "whole"]))
        grant = GpuGrant(gu.gpu.index, vram)
        if kind == "offer":
            grant = rules.candidate(gu, pod)[0] or grant
        elif kind == "instance" and gu.gpu.mig:
            grant = replace(grant, mig=data.draw(st.sampled_from(gu.gpu.mig)).ref)
        elif kind == "bogus":
            grant = replace(grant, mig=BOGUS_MIG)
        elif kind == "whole":
            grant = replace(grant, whole=True)
        attempt = Attempt(state, node, gu, pod, grant)
        yield attempt
        attempt.apply()


def snapshot(state: ClusterState) -> dict[str, object]:
    arrays = {name: getattr(state, name).copy() for name in ClusterState._ARRAYS if name != "version"}
    return {**arrays, "holders": sorted((h.pod.key, h.assignment) for h in state.holders())}  # type: ignore[dict-item]


def assert_same(a: dict[str, object], b: dict[str, object], what: str) -> None:
    for key, value in a.items():
        if isinstance(value, np.ndarray):
            np.testing.assert_array_equal(value, b[key], err_msg=f"{what}: {key}")
        else:
            assert value == b[key], f"{what}: {key}"


def every_gpu(state: ClusterState) -> Iterator[tuple[int, str, int, GpuUsage]]:
    for row, name in enumerate(state.node_names):
        for col, gu in enumerate(state.usage(name).gpus):
            yield row, name, col, gu


# ------------------------------------------------------------------------------------------------ checks
@by_name
@given(data=st.data())
@SETTINGS
def test_a_grant_the_mode_accepts_is_one_allocate_books(rules: ModeRules, data: st.DataObject) -> None:
    """The mode's `grant_problem` and `allocate` never disagree: what the filter and the solvers read as
    allowed is what binding books, and what they read as refused is never booked behind their back."""
    for attempt in history(data, rules):
        gu, pod, grant = attempt.gu, attempt.pod, attempt.grant
        if grant.whole:
            continue  # whole-GPU grants are the state's rule, the same for every mode
        problem = ("held whole" if gu.whole_holder is not None
                   else rules.grant_problem(gu, pod, grant, attempt.state.relax_tenancy))
        assert attempt.apply() == (problem is None), (problem, grant, gu)


@by_name
@given(data=st.data())
@SETTINGS
def test_unit_max_is_the_largest_grant_a_new_pod_gets_now(rules: ModeRules, data: st.DataObject) -> None:
    """`unit_max` is what the vectorised filter compares a pod's VRAM with: above what the mode grants it
    would pass pods allocate refuses; below it, refuse pods that fit. Never negative, never above `unit_cap`."""
    for attempt in history(data, rules):
        attempt.apply()
        state = attempt.state
        for _, name, _, gu in every_gpu(state):
            um, cap = gu.unit_max(), gu.unit_cap()
            assert 0 <= um <= cap <= gu.gpu.memory_mib, (um, cap, gu)
            tenant = owner_or(gu, TENANTS[0])
            above = PodDemand("ns/probe", um + 1, tenant=tenant)
            assert not any(accepts(state, name, above, g) for g in grants_for(gu, um + 1)), (um, gu)
            if um > 0:
                at = PodDemand("ns/probe", um, tenant=tenant)
                assert any(accepts(state, name, at, g) for g in grants_for(gu, um)), (um, gu)


@by_name
@given(data=st.data())
@SETTINGS
def test_unit_cap_is_the_largest_grant_an_empty_gpu_gives(rules: ModeRules, data: st.DataObject) -> None:
    """`unit_cap` decides "never fits here": above the truth, a pod waits for a GPU that can never take it;
    below it, a pod that would fit is told it never will. It does not move while the GPU is in use."""
    for attempt in history(data, rules):
        attempt.apply()
        state = attempt.state
        for _, name, col, gu in every_gpu(state):
            empty = ClusterState([state.node(name)])
            egu = empty.usage(name).gpus[col]
            cap = gu.unit_cap()
            assert cap == egu.unit_cap() == egu.unit_max(), (cap, gu)
            assert not any(accepts(empty, name, PodDemand("ns/probe", cap + 1), g) for g in grants_for(egu, cap + 1))
            if cap > 0:
                assert any(accepts(empty, name, PodDemand("ns/probe", cap), g) for g in grants_for(egu, cap))


@by_name
@given(data=st.data())
@SETTINGS
def test_free_is_capacity_minus_the_grants_held(rules: ModeRules, data: st.DataObject) -> None:
    """The books match the holders after any run of grants and releases: no VRAM, pod count, tenant or MIG
    instance leaks (a GPU that looks full when it is not, or free when it is not)."""
    for attempt in history(data, rules):
        attempt.apply()
        state = attempt.state
        for _, name, col, gu in every_gpu(state):
            on = [(h, g) for h in state.holders_on(name) for g in h.assignment.gpus if g.index == gu.gpu.index]
            assert gu.pods == len(on)
            assert gu.used_mib == sum(g.vram_mib for _, g in on if g.mig is None and not g.whole)
            assert gu.mig_holder == {g.mig: h.pod.key for h, g in on if g.mig is not None}
            tenants: dict[str, int] = {}
            for h, _ in on:
                tenants[h.pod.tenant] = tenants.get(h.pod.tenant, 0) + 1
            assert gu.tenants == tenants
            assert 0 <= gu.stranded_mib() <= gu.gpu.memory_mib
            if gu.whole_holder is not None:
                assert (gu.unit_max(), gu.pool_free(), gu.slots_free()) == (0, 0, 0)
                continue
            empty = ClusterState([state.node(name)]).usage(name).gpus[col]
            taken = sum(gu.gpu.instance(g.mig).memory_mib if g.mig is not None  # type: ignore[union-attr]
                        else rules.grant_unit(gu) or g.vram_mib for _, g in on)
            assert gu.pool_free() == empty.pool_free() - taken >= 0, (gu.pool_free(), empty.pool_free(), taken)
            assert gu.slots_free() == max(0, min(rules.max_pods(gu) - gu.pods, 1 << 30))
            assert gu.pods <= rules.max_pods(gu)


@by_name
@given(data=st.data())
@SETTINGS
def test_a_refused_grant_changes_nothing_and_release_restores_exactly(rules: ModeRules, data: st.DataObject) -> None:
    """`allocate` is all-or-nothing and `release` its exact inverse: a refused grant or a released pod leaves
    no trace in the books or the arrays the filter reads."""
    state: ClusterState | None = None
    empty: dict[str, object] = {}
    for attempt in history(data, rules):
        if state is None:
            state, empty = attempt.state, snapshot(ClusterState(attempt.state.nodes()))
        before = snapshot(state)
        if not attempt.apply():
            assert_same(before, snapshot(state), f"refused {attempt.grant}")
    assert state is not None
    for h in state.holders():
        state.release(h.pod.key)
    assert_same(empty, snapshot(state), "released everything")
    assert state.stranded_mib() == 0


@by_name
@given(data=st.data())
@SETTINGS
def test_the_vectorised_filter_agrees_with_allocate_on_every_gpu(rules: ModeRules, data: st.DataObject) -> None:
    """`fit.feasible` reads the numpy arrays, `allocate` the mode's rules: for every pod shape they say the
    same per GPU (else the filter passes nodes bind refuses, or hides nodes that fit), and `never` only where
    even an empty node refuses. The arrays the filter reads are the rules' own answers."""
    for step, attempt in enumerate(history(data, rules)):
        attempt.apply()
        state = attempt.state
        gu = data.draw(st.sampled_from(state.usage(attempt.node).gpus))
        probe = PodDemand(
            f"ns/probe-{step}",
            data.draw(st.sampled_from(VRAMS) | st.sampled_from([max(1, gu.unit_max()), gu.unit_max() + 1])),
            gpu_count=data.draw(st.sampled_from([1, 1, 2])),
            tenant=data.draw(st.sampled_from(TENANTS)),
            isolation=data.draw(st.sampled_from(list(Isolation))),
            models=data.draw(st.sampled_from([None, frozenset({"a100-80gb"}), frozenset({"nvidia-a30"})])))
        one = replace(probe, gpu_count=1)
        for whole in (False, True):
            mask = fit.feasible(state, probe, whole_gpu=whole)
            for row, name in enumerate(state.node_names):
                usage, empty = state.usage(name), ClusterState([state.node(name)])
                ok = [any(accepts(state, name, one, g) for g in grants_for(x, one.vram_mib, whole))
                      for x in usage.gpus]
                ever = [any(accepts(empty, name, one, g) for g in grants_for(x, one.vram_mib, whole))
                        for x in empty.usage(name).gpus]
                assert list(mask.gpu_ok[row, : len(ok)]) == ok, (name, whole, probe)
                assert not mask.gpu_ok[row, len(ok):].any()
                # A k-GPU pod takes k GPUs of one pod group it may take k of (packing.modes.combine).
                assert bool(mask.now[row]) == (one_group(usage.gpus, ok, probe, whole) >= probe.gpu_count), \
                    (name, whole, probe)
                assert bool(mask.never[row]) == (one_group(usage.gpus, ever, probe, whole) < probe.gpu_count), \
                    (name, whole, probe)
        for row, _, col, x in every_gpu(state):
            mirrored = (state.unit_max, state.unit_cap, state.pool_free, state.slots_free, state.shared, state.open)
            want = (x.unit_max(), x.unit_cap(), x.pool_free(), x.slots_free(), rules.shared, x.tenant() is None)
            assert tuple(a[row, col] for a in mirrored) == want, x


def one_group(gpus: list[GpuUsage], ok: list[bool], pod: PodDemand, whole: bool) -> int:
    """The most GPUs marked `ok` of one pod group that the pod may take `gpu_count` of."""
    counts: dict[str, int] = {}
    for x, good in zip(gpus, ok, strict=True):
        rules = WHOLE_GPU if whole else x.rules
        if good and group_allows(rules, pod.gpu_count, pod.gpu_per_process):
            counts[rules.pod_group] = counts.get(rules.pod_group, 0) + 1
    return max(counts.values(), default=0)


@by_name
@given(data=st.data())
@SETTINGS
def test_a_shared_gpu_never_holds_two_tenants(rules: ModeRules, data: st.DataObject) -> None:
    """A shared mode is one failure domain: a second tenant on it would see the first's faults (and, under
    MPS, its memory); only `relax_tenancy` lifts the rule. A mode that is not shared says so, and the rule
    never refuses it a second tenant."""
    for attempt in history(data, rules, relax=False):
        gu, pod = attempt.gu, attempt.pod
        stranger = bool(gu.tenants) and pod.tenant not in gu.tenants and gu.whole_holder is None
        if attempt.apply() and stranger:
            assert not rules.shared, f"{rules.name} took tenant {pod.tenant} beside {set(gu.tenants)}"
        for _, _, _, x in every_gpu(attempt.state):
            if rules.shared:
                assert len(x.tenants) <= 1, x
                assert x.tenant() == (next(iter(x.tenants)) if x.tenants else None)
            else:
                assert x.tenant() is None
    assert {mode in SHARED_MODES for mode, _ in CONFIGS[id(rules)]} == {rules.shared}
