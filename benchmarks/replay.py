"""Replay a GPU-sharing trace through vramfit's placement core, with the FGD paper's protocol.

Protocol (shared/reference/fgd-benchmark.md §2), one run = one (policy, seed):
1. Nodes are named `"%04d-" + name` with the prefix from a seeded permutation and put in the state in that
   order, so the core's "ties to the lowest node index" is the simulator's lexicographic tie-break.
2. Tasks are sorted by name, shuffled by the seed, then inflated: copies drawn uniformly with replacement
   from the original tasks are appended until the total GPU request would pass `tune` x cluster GPU
   capacity (the stopping test adds the candidate's *per-GPU* milli, the total adds `k * d`; the copy that
   trips the test is dropped), as `tuneUpPods` does. A `tune` below the trace's own request removes random
   tasks instead (`tuneDownPods`).
3. Each task is tried once with `packing.place.schedule_one`; failures are not retried; nothing is deleted.
4. After every attempt we record arrived GPU milli (failures included), allocated GPU milli, the cluster's
   fragmentation F(M) (`benchmarks.peers.workload_frag`, the same code FGD scores with) and idle GPU milli.
5. Events are binned by arrived workload (% of capacity, rounded half-to-even like pandas' `round`), 0..130;
   an empty bin takes the events of its +-1 neighbours.

Randomness: the simulator seeds Go's math/rand, whose stream we cannot reproduce in Python; we use numpy's
PCG64 seeded with the same seed, in the order node permutation -> task shuffle -> inflation. Random-fit's
draws come from its own generator seeded with the seed. Results therefore match the paper's seeds in
distribution, not run by run.

Trace GPUs become time-sliced GPUs with `memory_mib = 1000` (one MiB stands for one milli-GPU) and 1000
replicas, so only capacity limits; a task becomes a `PodDemand` with `vram_mib = gpu_milli` per GPU.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import peers, research_policies
from benchmarks.peers.workload_frag import FragMemo, TargetWorkload, row_count, target_workload
from benchmarks.trace import (
    DEFAULT_NODES_CSV,
    DEFAULT_PODS_CSV,
    MILLI,
    TraceNode,
    TraceTask,
    load_nodes,
    load_tasks,
)
from packing import cycle
from packing.fit import GROUP_OF_CODE
from packing.model import Gpu, Mode, Node, PodDemand
from packing.modes import POD_GROUPS, group_allows
from packing.place import schedule_one
from packing.policies import Policy, get_policy, policy_factory, takes_param
from packing.state import ClusterState

# The FGD paper's policies and vramfit's research variants are the benchmark's, not the core's: every replay can
# name them.
peers.register()
research_policies.register()

TENANT = "trace"
REPLICAS = 1000  # time-slicing replicas per GPU: high enough that only capacity limits
MAX_ARRIVED_PCT = 130


@dataclass(frozen=True)
class CurvePoint:
    arrived_pct: int
    alloc_pct: float
    frag_rate_pct: float
    frag_amount_pct: float

    @property
    def unallocated_pct(self) -> float:
        return 100.0 - self.alloc_pct


@dataclass
class RunResult:
    """One replay: the binned curve plus counts and timing."""

    policy: str
    seed: int
    tune: float
    nodes: int
    gpus: int
    tasks_original: int
    tasks: int  # after inflation
    placed: int
    failed: int
    wall_s: float
    curve: list[CurvePoint] = field(default_factory=list)
    failed_by_kind: dict[str, int] = field(default_factory=dict)

    def point(self, arrived_pct: int) -> CurvePoint | None:
        for p in self.curve:
            if p.arrived_pct == arrived_pct:
                return p
        return None

    def unallocated_at(self, arrived_pct: int) -> float | None:
        p = self.point(arrived_pct)
        return None if p is None else p.unallocated_pct

    def frag_rate_at(self, arrived_pct: int) -> float | None:
        p = self.point(arrived_pct)
        return None if p is None else p.frag_rate_pct

    def to_json(self) -> dict[str, Any]:
        """The run entry of OUT.json (`{"policy", "seed", "curve": [...]}`)."""
        return {"policy": self.policy, "seed": self.seed,
                "curve": [{k: (round(v, 4) if isinstance(v, float) else v) for k, v in asdict(p).items()}
                          for p in self.curve]}


# ------------------------------------------------------------------------------------------- protocol
def node_order(nodes: Sequence[TraceNode], rng: np.random.Generator) -> list[tuple[str, TraceNode]]:
    """`"%04d-" + name` with a seeded permutation as prefix, sorted by that name (the tie-break order)."""
    perm = rng.permutation(len(nodes))
    named = [(f"{int(perm[i]):04d}-{n.name}", n) for i, n in enumerate(nodes)]
    named.sort(key=lambda x: x[0])
    return named


def to_node(name: str, n: TraceNode) -> Node:
    gpus = tuple(Gpu(index=j, memory_mib=MILLI, mode=Mode.TIMESLICE, product=n.model, model=n.model,
                     replicas=REPLICAS) for j in range(n.gpu_count))
    return Node(name=name, gpus=gpus, cpu_milli=n.cpu_milli, memory_mib=n.memory_mib)


def build_state(ordered: Sequence[tuple[str, TraceNode]]) -> ClusterState:
    """The core's state with the trace nodes in tie-break order."""
    nodes = [to_node(name, n) for name, n in ordered]
    return ClusterState(nodes, max_gpus=max([8] + [len(n.gpus) for n in nodes]))


def to_demand(t: TraceTask, key: str) -> PodDemand:
    # A GPU task whose gpu_milli clamped to 0 asks no GPU capacity; the simulator's frag measure already
    # treats it as CPU-only (d == 0), and so do we.
    gpu_count = t.num_gpu if t.gpu_milli > 0 else 0
    models = frozenset(m.lower() for m in t.gpu_spec) if t.gpu_spec else None
    return PodDemand(key=key, vram_mib=t.gpu_milli if gpu_count else 0, gpu_count=gpu_count, tenant=TENANT,
                     models=models, cpu_milli=t.cpu_milli, memory_mib=t.memory_mib)


def arrival_order(tasks: Sequence[TraceTask], rng: np.random.Generator) -> list[TraceTask]:
    by_name = sorted(tasks, key=lambda t: t.name)
    return [by_name[i] for i in rng.permutation(len(by_name))]


def inflate(shuffled: Sequence[TraceTask], original: Sequence[TraceTask], tune: float, capacity_milli: int,
            rng: np.random.Generator) -> list[tuple[str, TraceTask]]:
    """Tasks to replay, keyed by pod name: the shuffled trace plus resampled copies `<name>-tuned-<i>`."""
    out = [(t.name, t) for t in shuffled]
    total = sum(t.total_gpu_milli for t in shuffled)
    target = tune * float(capacity_milli)
    if tune <= 0 or float(total) == target:
        return out
    if not any(t.total_gpu_milli for t in original):
        return out  # nothing asks a GPU: no copy could ever reach the target (the simulator panics here)
    if float(total) > target:
        while float(total) > target and out:
            _, gone = out.pop(int(rng.integers(len(out))))
            total -= gone.total_gpu_milli
        return out
    n = len(original)
    i = 0
    while True:
        cand = original[int(rng.integers(n))]
        if float(total + cand.gpu_milli) > target:  # the simulator's quirk: per-GPU milli in the test
            break
        total += cand.total_gpu_milli
        out.append((f"{cand.name}-tuned-{i}", cand))
        i += 1
    return out


def workload_of(tasks: Sequence[TraceTask], threshold_pct: float = 95.0) -> TargetWorkload:
    """The target workload M from the original (un-inflated) tasks."""
    return target_workload((t.spec_key for t in tasks), threshold_pct)


def make_policy(name: str, seed: int, workload: TargetWorkload, extra: dict[str, Any] | None = None) -> Policy:
    """A fresh policy from the core's registry, given the seed and the target workload when it takes them.

    `extra` params are passed as given (a factory that does not take them raises TypeError)."""
    policy_factory(name)  # unknown names raise KeyError listing the known ones
    params: dict[str, Any] = {key: value for key, value in (("seed", seed), ("workload", workload))
                              if takes_param(name, key)}
    params.update(extra or {})
    return get_policy(name, **params)


def _kind(t: TraceTask) -> str:
    if t.num_gpu == 0:
        return "cpu"
    if t.num_gpu == 1 and t.gpu_milli < MILLI:
        return "share"
    return f"{t.num_gpu}-gpu"


# ------------------------------------------------------------------------------------------------ step
def trace_feasible(state: ClusterState, pod: PodDemand) -> np.ndarray:
    """[N] nodes where the pod fits now: `fit.feasible(...).now` specialised to a replay state.

    Valid only for states built by `to_node` (every GPU time-sliced with 1000 replicas, one tenant): then
    the mode, isolation, replica and tenancy terms of the general filter are all true and drop out. A
    multi-GPU pod's GPUs are still counted per pod group the pod may take that many of, as the core's filter
    counts them (`packing.modes.combine`), so a state of several modes never passes a node on a mixed set. It
    was written when the general filter was most of a replay's time; replays are still 25-35 % faster
    with it (RESULTS.md, "Speed"). tests/benchmarks/test_bench_replay.py checks it equals the core's filter on
    random replay states.
    """
    now = (state.cpu_free >= pod.cpu_milli) & (state.host_mem_free >= pod.memory_mib)
    if pod.gpu_count == 0:
        return now
    ok = state.unit_max >= pod.vram_mib  # absent slots hold 0 and pods ask > 0
    if pod.models:
        ok &= state.allowed_kinds(pod.models)[state.kind]
    if pod.gpu_count == 1:
        return now & (row_count(ok) >= 1)
    return now & (_one_group_count(ok, state, pod) >= pod.gpu_count)


def _one_group_count(ok: np.ndarray, state: ClusterState, pod: PodDemand) -> np.ndarray:
    """[N] the most GPUs in `ok` ([N, G]) of one pod group a pod of this GPU count may take (as `fit.feasible`)."""
    groups = GROUP_OF_CODE[state.mode]
    best = np.zeros(ok.shape[0], dtype=np.int64)
    for gi, rules in enumerate(POD_GROUPS.values()):
        if group_allows(rules, pod.gpu_count, pod.gpu_per_process):
            best = np.maximum(best, row_count(ok & (groups == gi)))
    return best


def fast_step(state: ClusterState, pod: PodDemand, policy: Policy) -> str | None:
    """One `schedule_one` step with the replay filter: observe -> `trace_feasible` -> the core's cycle
    (`packing.cycle.place`: score, highest first with ties to the lowest index, choose, commit)."""
    policy.observe(pod)
    assignment = cycle.place(state, pod, policy, trace_feasible(state, pod))
    return None if assignment is None else assignment.node


def core_step(state: ClusterState, pod: PodDemand, policy: Policy) -> str | None:
    """One step through `packing.place.schedule_one` verbatim (general filter)."""
    return schedule_one(state, pod, policy, explain_failures=False).node


STEPS: dict[str, Callable[[ClusterState, PodDemand, Policy], str | None]] = {"fast": fast_step, "core": core_step}


# ------------------------------------------------------------------------------------------------ run
def replay(nodes: Sequence[TraceNode], tasks: Sequence[TraceTask], policy_name: str, seed: int,
           tune: float = 1.3, threshold_pct: float = 95.0,
           progress: Callable[[int, int], None] | None = None, step: str = "core",
           on_step: Callable[[ClusterState, PodDemand, str | None], None] | None = None,
           policy_params: dict[str, Any] | None = None) -> RunResult:
    """One run of the protocol on in-memory records (see module docstring).

    on_step(state, pod, node or None) is called after every attempt (tests check invariants with it).
    policy_params are extra keyword arguments for the policy factory (seed and workload are passed already
    when the factory takes them).

    step: "core" (default) calls `packing.place.schedule_one` as is; "fast" filters with `trace_feasible`
    instead of the general filter; both score, choose and allocate through the same core objects and give
    identical placements (tests/benchmarks/test_bench_replay.py).
    """
    place = STEPS[step]
    t0 = time.perf_counter()
    rng = np.random.default_rng(seed)
    ordered = node_order(nodes, rng)
    state = build_state(ordered)
    cap = MILLI * sum(n.gpu_count for n in nodes)
    if cap <= 0:
        raise ValueError("the node list has no GPUs")
    shuffled = arrival_order(tasks, rng)
    to_run = inflate(shuffled, tasks, tune, cap, rng)
    wl = workload_of(tasks, threshold_pct)
    policy = make_policy(policy_name, seed, wl, policy_params)

    access_id, access_table = wl.access_ids([n.model for _, n in ordered])
    memo = FragMemo(wl, access_table)
    left = state.pool_free.astype(np.int64)  # absent slots hold 0
    node_frag = memo.rows(left, state.cpu_free, access_id)  # [N] kept * F_n(M)
    frag_sum = int(node_frag.sum())
    idle_sum = int(left.sum())
    used = 0
    arrived = 0
    t_n = len(to_run)
    ev_arrived = np.zeros(t_n, dtype=np.int64)
    ev_used = np.zeros(t_n, dtype=np.int64)
    ev_frag = np.zeros(t_n, dtype=np.int64)
    ev_idle = np.zeros(t_n, dtype=np.int64)
    placed = 0
    failed_by_kind: dict[str, int] = {}
    step = max(1, t_n // 100)
    for e, (name, task) in enumerate(to_run):
        pod = to_demand(task, f"{TENANT}/{name}")
        arrived += task.total_gpu_milli
        node = place(state, pod, policy)
        if on_step is not None:
            on_step(state, pod, node)
        if node is not None:
            placed += 1
            i = state.index_of(node)
            used += pod.vram_mib * pod.gpu_count
            f_new = int(memo.rows(state.pool_free[i:i + 1], state.cpu_free[i:i + 1], access_id[i:i + 1])[0])
            frag_sum += f_new - int(node_frag[i])
            node_frag[i] = f_new
            idle_sum -= pod.vram_mib * pod.gpu_count
        else:
            k = _kind(task)
            failed_by_kind[k] = failed_by_kind.get(k, 0) + 1
        ev_arrived[e] = arrived
        ev_used[e] = used
        ev_frag[e] = frag_sum
        ev_idle[e] = idle_sum
        if progress is not None and (e % step == 0 or e == t_n - 1):
            progress(e + 1, t_n)
    curve = bin_curve(ev_arrived, ev_used, ev_frag, ev_idle, cap, wl.kept)
    return RunResult(policy=policy_name, seed=seed, tune=tune, nodes=len(nodes), gpus=cap // MILLI,
                     tasks_original=len(tasks), tasks=t_n, placed=placed, failed=t_n - placed,
                     wall_s=time.perf_counter() - t0, curve=curve, failed_by_kind=failed_by_kind)


def bin_curve(arrived: np.ndarray, used: np.ndarray, frag_scaled: np.ndarray, idle: np.ndarray, cap: int,
              kept: int, max_pct: int = MAX_ARRIVED_PCT) -> list[CurvePoint]:
    """Per-event metrics -> one point per integer arrived-% bin, as the authors' merge scripts bin them."""
    arrived_pct = np.round(arrived / cap * 100.0)  # numpy rounds half to even, like pandas' round(x, 0)
    alloc = np.round(used / cap * 100.0, 2)
    frag = frag_scaled.astype(np.float64) / float(kept)
    with np.errstate(divide="ignore", invalid="ignore"):
        rate = np.where(idle > 0, frag / np.maximum(idle, 1) * 100.0, 0.0)
    amount = frag / cap * 100.0
    out: list[CurvePoint] = []
    for b in range(0, max_pct + 1):
        sel = arrived_pct == b
        if not sel.any():
            sel = (arrived_pct >= b - 1) & (arrived_pct <= b + 1)
            if not sel.any():
                continue
        out.append(CurvePoint(arrived_pct=b, alloc_pct=round(float(alloc[sel].mean()), 2),
                              frag_rate_pct=float(rate[sel].mean()), frag_amount_pct=float(amount[sel].mean())))
    return out


def run(nodes_csv: str | Path = DEFAULT_NODES_CSV, pods_csv: str | Path = DEFAULT_PODS_CSV,
        policy_name: str = "paper:fgd", seed: int = 42, tune: float = 1.3,
        progress: Callable[[int, int], None] | None = None, step: str = "core",
        policy_params: dict[str, Any] | None = None) -> RunResult:
    """Load the CSVs and replay once: the entry point other engineers call."""
    return replay(load_nodes(nodes_csv), load_tasks(pods_csv), policy_name, seed, tune, progress=progress,
                  step=step, policy_params=policy_params)
