"""Hypothesis strategies for random clusters and pods (every mode; MIG layouts drawn from valid ones, dynamic
MIG GPUs listing every placement their geometry allows or some of them)."""

from __future__ import annotations

from hypothesis import strategies as st

from packing.catalog import all_layouts, load_catalog
from packing.model import Gpu, Isolation, MigInstance, Mode, Node, PodDemand
from packing.modes.mig_dynamic import placements_for

CATALOG = load_catalog()
MODELS = ("A100-80GB", "H100-80GB", "A30-24GB")
PRODUCTS = {"A100-80GB": "NVIDIA-A100-SXM4-80GB", "H100-80GB": "NVIDIA-H100-80GB-HBM3", "A30-24GB": "NVIDIA-A30"}
TENANTS = ("team-a", "team-b", "team-c")
VRAMS = (1024, 3072, 5000, 9000, 14336, 20000, 30720, 40000, 70000, 80000)


@st.composite
def mig_layouts(draw: st.DrawFn, name: str) -> tuple[MigInstance, ...]:
    """The instances of one valid MIG layout of catalog model `name`."""
    model = CATALOG.get(name)
    assert model is not None and model.mig is not None
    insts = []
    for p in draw(st.sampled_from(all_layouts(model))):
        prof = model.mig.profile(p.profile)
        assert prof is not None
        insts.append(MigInstance(prof.name, p.start, prof.memory_slices, prof.compute_slices, prof.memory_mib))
    return tuple(insts)


@st.composite
def mig_placements(draw: st.DrawFn, name: str) -> tuple[MigInstance, ...]:
    """The placements a dynamic MIG GPU of catalog model `name` publishes: every one its geometry allows, or
    (as a GPU may publish only part) a non-empty subset of them, in the same order."""
    model = CATALOG.get(name)
    assert model is not None and model.mig is not None
    every = placements_for(model)
    some = st.lists(st.sampled_from(every), min_size=1, unique=True).map(lambda xs: tuple(i for i in every if i in xs))
    return draw(st.just(every) | some)


@st.composite
def gpus(draw: st.DrawFn, index: int) -> Gpu:
    name = draw(st.sampled_from(MODELS))
    model = CATALOG.get(name)
    assert model is not None and model.mig is not None
    mode = draw(st.sampled_from(list(Mode)))
    base = {"index": index, "memory_mib": model.memory_mib, "product": PRODUCTS[name], "model": name}
    if mode is Mode.MIG:
        return Gpu(mode=mode, mig=draw(mig_layouts(name)), **base)  # type: ignore[arg-type]
    if mode is Mode.MIG_DYNAMIC:
        return Gpu(mode=mode, mig=draw(mig_placements(name)), **base)  # type: ignore[arg-type]
    if mode is Mode.MPS:
        return Gpu(mode=mode, replicas=draw(st.sampled_from([None, 2, 3, 4, 7])), **base)  # type: ignore[arg-type]
    if mode is Mode.TIMESLICE:
        return Gpu(mode=mode, replicas=draw(st.integers(2, 8)), **base)  # type: ignore[arg-type]
    return Gpu(mode=mode, **base)  # type: ignore[arg-type]


@st.composite
def nodes(draw: st.DrawFn, max_nodes: int = 3, max_gpus: int = 4) -> list[Node]:
    count = draw(st.integers(1, max_nodes))
    out = []
    for n in range(count):
        k = draw(st.integers(1, max_gpus))
        cpu = draw(st.sampled_from([None, 16000, 64000]))
        out.append(Node(f"node-{n}", tuple(draw(gpus(i)) for i in range(k)), cpu_milli=cpu))
    return out


@st.composite
def pods(draw: st.DrawFn, index: int) -> PodDemand:
    return PodDemand(
        key=f"ns/pod-{index}",
        vram_mib=draw(st.sampled_from(VRAMS)),
        gpu_count=draw(st.sampled_from([1, 1, 1, 2])),
        tenant=draw(st.sampled_from(TENANTS)),
        isolation=draw(st.sampled_from(list(Isolation))),
        models=draw(st.sampled_from([None, None, frozenset({"a100-80gb"}), frozenset({"nvidia-h100-80gb-hbm3"})])),
        cpu_milli=draw(st.sampled_from([0, 2000, 8000])),
    )
