"""Random small clusters and a brute-force placer, shared by the solver tests (optimal, capacity, repartition)."""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator, Sequence

from packing.catalog import all_layouts, load_catalog
from packing.model import Assignment, Gpu, GpuGrant, Isolation, MigInstance, Mode, Node, PodDemand
from packing.planning.queue_plan import QueuePlan
from packing.state import ClusterState, PlacementError
from packing.usage import GpuUsage

CATALOG = load_catalog()
A100 = CATALOG.get("A100-80GB")
assert A100 is not None and A100.mig is not None
A100_LAYOUTS = [lay for lay in all_layouts(A100) if lay]


def mig_instances(layout: Sequence[object]) -> tuple[MigInstance, ...]:
    assert A100 is not None and A100.mig is not None
    out = []
    for pl in layout:
        prof = A100.mig.profile(pl.profile)  # type: ignore[attr-defined]
        assert prof is not None
        out.append(MigInstance(prof.name, pl.start, prof.memory_slices, prof.compute_slices,  # type: ignore[attr-defined]
                               prof.memory_mib))
    return tuple(out)


def a100(index: int, mode: Mode, replicas: int | None = None, layout: Sequence[object] = ()) -> Gpu:
    return Gpu(index=index, memory_mib=81920, mode=mode, product="NVIDIA-A100-SXM4-80GB", model="A100-80GB",
               replicas=replicas, mig=mig_instances(layout) if mode is Mode.MIG else ())


def t4(index: int, mode: Mode, replicas: int | None = None) -> Gpu:
    return Gpu(index=index, memory_mib=15360, mode=mode, product="Tesla-T4", model="T4", replicas=replicas)


def random_gpu(rng: random.Random, index: int) -> Gpu:
    kind = rng.choice(["excl", "mig", "mps", "mps-pinned", "ts", "t4-ts", "t4"])
    if kind == "excl":
        return a100(index, Mode.EXCLUSIVE)
    if kind == "mig":
        return a100(index, Mode.MIG, layout=rng.choice(A100_LAYOUTS))
    if kind == "mps":
        return a100(index, Mode.MPS, replicas=rng.choice([2, 3, 4]))
    if kind == "mps-pinned":
        return a100(index, Mode.MPS)
    if kind == "ts":
        return a100(index, Mode.TIMESLICE, replicas=rng.choice([2, 3, 4]))
    if kind == "t4-ts":
        return t4(index, Mode.TIMESLICE, replicas=rng.choice([2, 4]))
    return t4(index, Mode.EXCLUSIVE)


VRAMS = [3072, 9000, 14336, 19000, 30720, 40000, 60000]


def random_pod(rng: random.Random, key: str, max_gpus: int = 2) -> PodDemand:
    return PodDemand(
        key=key,
        vram_mib=rng.choice(VRAMS),
        gpu_count=1 if rng.random() < 0.8 else rng.randint(2, max_gpus),
        tenant=rng.choice(["team-a", "team-b"]),
        isolation=rng.choice(list(Isolation)),
        models=frozenset({"t4"}) if rng.random() < 0.1 else None,
        cpu_milli=rng.choice([0, 1000, 4000]),
        memory_mib=rng.choice([0, 8192]),
    )


def random_cluster(seed: int, n_nodes: int = 2, max_gpus: int = 3, n_existing: int = 2,
                   track_cpu: bool | None = None) -> ClusterState:
    rng = random.Random(seed)
    nodes = []
    for i in range(n_nodes):
        gpus = tuple(random_gpu(rng, j) for j in range(rng.randint(1, max_gpus)))
        tracked = rng.random() < 0.5 if track_cpu is None else track_cpu
        nodes.append(Node(name=f"n{i}", gpus=gpus, cpu_milli=8000 if tracked else None,
                          memory_mib=32768 if tracked else None))
    state = ClusterState(nodes)
    # Existing holders: first valid option found for a few random pods.
    for j in range(n_existing):
        pod = random_pod(rng, f"run/p{j}")
        for asg in options(state, pod):
            state.allocate(pod, asg)
            break
    return state


def random_pending(seed: int, n: int, max_gpus: int = 2) -> list[PodDemand]:
    rng = random.Random(seed * 7919 + 1)
    return [random_pod(rng, f"q/p{i}", max_gpus) for i in range(n)]


def gpu_usage(state: ClusterState, node: str, index: int) -> GpuUsage:
    """The books of GPU `index` of `node`; KeyError when the node has no such GPU."""
    found = next((gu for gu in state.usage(node).gpus if gu.gpu.index == index), None)
    if found is None:
        raise KeyError(f"{node} has no GPU {index}")
    return found


def planned_node(plan: QueuePlan, key: str) -> str | None:
    """The node a queue plan puts pod `key` on (None: it does not place it)."""
    asg = plan.assignments.get(key)
    return asg.node if asg is not None else None


def unit_options(state: ClusterState, node: str, index: int) -> list[str | None]:
    gu = gpu_usage(state, node, index)
    if gu.gpu.mode is Mode.MIG:
        return [i.ref for i in gu.free_instances()]
    return [None]


def options(state: ClusterState, pod: PodDemand) -> Iterator[Assignment]:
    """Every assignment of `pod` the core accepts now (brute force over nodes, GPU sets and units)."""
    for name in state.node_names:
        idx = [g.index for g in state.node(name).gpus]
        for combo in itertools.combinations(idx, pod.gpu_count):
            for units in itertools.product(*(unit_options(state, name, i) for i in combo)):
                asg = Assignment(name, tuple(GpuGrant(index=i, vram_mib=pod.vram_mib, mig=u)
                                             for i, u in zip(combo, units, strict=True)))
                try:
                    state.check(pod, asg)
                except PlacementError:
                    continue
                yield asg


def opened(before: ClusterState, after: ClusterState) -> int:
    n = 0
    for name in before.node_names:
        for a, b in zip(before.usage(name).gpus, after.usage(name).gpus, strict=True):
            n += int(not a.grants and bool(b.grants))
    return n


def brute_force(state: ClusterState, pending: Sequence[PodDemand]) -> tuple[int, int]:
    """Best (pods placed, -GPUs opened) over every combination of options (tiny instances only)."""
    base = state.copy()
    work = state.copy()
    best = (-1, 0)

    def rec(i: int, placed: int) -> None:
        nonlocal best
        if placed + (len(pending) - i) < best[0]:
            return
        if i == len(pending):
            cand = (placed, -opened(base, work))
            best = max(best, cand)
            return
        pod = pending[i]
        for asg in list(options(work, pod)):
            work.allocate(pod, asg)
            rec(i + 1, placed + 1)
            work.release(pod.key)
        rec(i + 1, placed)

    rec(0, 0)
    return best
