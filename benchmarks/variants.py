"""Seeded trace variants of the default trace, sampled the way the published openb variants were (issue 14).

`make_variant(tasks, family, pct, seed) -> list[TraceTask]` is pure: the same inputs give the same list, the
input is not modified, and nothing but numpy's PCG64 seeded with `seed` is random. Families:

- ``gpushare`` (pct = share of GPU tasks that share a GPU, 0..100). *Followed* (counted on
  `openb_pod_list_gpushare100.csv` against the default trace): the task count (8152) and the CPU-only tasks are
  kept; every GPU task is re-drawn, with replacement, from the default trace's tasks of the wanted kind (every
  one of gpushare100's 7064 GPU rows has the (cpu, memory, 1, gpu_milli) of a default sharing task, and its
  gpu_milli histogram matches the default's sharing one). *Inferred* for pct < 100: exactly
  `round(pct/100 * n_gpu)` GPU slots are drawn from the default's sharing tasks, the others from its whole-GPU
  tasks (1-GPU and multi-GPU, gpu_milli 1000). The default trace itself is gpushare 43.6 (3078 of 7064), which is
  why the paper's list starts at 40. Names stay the default's; times, qos and phase are not modelled.
- ``multigpu`` (pct = share of the GPU demand, sum k*d, carried by multi-GPU tasks). *Followed*
  (`openb_pod_list_multigpu20.csv`): the default trace is kept as is and copies of its multi-GPU tasks (75;
  2/4/8 GPUs) are appended, drawn uniformly with replacement, named `openb-pod-8152`, `-8153`, ... (172 copies,
  1000 GPUs; the published file ends at 20.4 % multi-GPU demand). *Inferred*: we append until the multi-GPU
  share first reaches pct (so it ends within one task, <= 8 GPUs, above pct; nothing is added when the trace is
  already there).
- ``gpuspec`` (pct = share of GPU tasks given a GPU-model constraint). *Followed* (`openb_pod_list_gpuspec10.csv`):
  only `gpu_spec` changes, on GPU tasks only (732 of 7064 = 10.4 %); the spec strings are recorded production
  values (one to seven models, 82 % a single one, duplicates such as `V100M16|V100M32|V100M32` kept), and they
  depend on the task kind (P100 goes almost only to sharing tasks, `V100M16|V100M32` only to whole-GPU ones).
  *Inferred*: exactly `round(pct/100 * n_gpu)` GPU tasks, chosen uniformly without replacement, get a spec
  drawn from gpuspec10's spec strings *of the same kind* (sharing / 1 whole GPU / multi-GPU) with their
  published frequencies, restricted to specs under which the task fits on some node of the node list (a model
  with a node of >= k GPUs, enough CPU and memory); a task no spec of its kind fits draws from all kinds, and
  one no spec fits at all is skipped for the next candidate. Only models of the node list are ever named.
- ``cpuheavy`` (pct = share of all tasks whose CPU request is multiplied by `CPU_FACTOR` = 2, capped at the
  largest node's CPU). *Not a published family*: the paper's cpu050..cpu250 traces vary the share of CPU-only
  tasks instead (shared/reference/fgd-benchmark.md §2), and no such file is here to count on. Issue 14 asks for
  "more CPU per task"; scaling every task would make CPU, not GPU, the binding resource at ~1.6x the cluster's
  CPU, so a pct share of tasks (uniform, without replacement) is doubled instead: cpuheavy 20 asks ~24 % more
  CPU (the default asks 80 % of the cluster's CPU at 98 % GPU arrival).

Sources: the three published variant files in `benchmarks/data/` (PROVENANCE.md; alibaba/clusterdata
cluster-trace-gpu-v2023, commit 7a6c496e) compared with the default trace; the trace's README
(shared/traces/alibaba-gpu-2023) for what each file is; shared/reference/fgd-benchmark.md §2 for the paper's
list of variants (gpushare40-100, multigpu20-50, gpuspec10-33, cpu050-250). The reference does not describe the
generation procedure; everything marked *inferred* above is ours.

The suite (`TUNING`, `TWINS`, `HELD_OUT`, `FRESH`) is data: a setting plus the generator seed that produced it.
HELD_OUT uses other settings *and* other generator seeds than TUNING and must stay out of any tuning loop; FRESH
repeats HELD_OUT's settings with seeds of their own (see TWINS for why).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path

import numpy as np

from benchmarks.trace import DATA_DIR, MILLI, TraceNode, TraceTask, load_nodes, load_tasks

FAMILIES = ("default", "gpushare", "multigpu", "gpuspec", "cpuheavy")
CPU_FACTOR = 2.0
SPEC_SOURCE_CSV = DATA_DIR / "openb_pod_list_gpuspec10.csv"
GENERATOR_VERSION = 1  # bump when the sampling changes: cached results of another version are not reused


def kind(t: TraceTask) -> str:
    """'cpu', 'share' (1 GPU, d < 1000), 'whole' (1 whole GPU) or 'multi' (k >= 2 whole GPUs)."""
    if t.num_gpu == 0 or t.gpu_milli == 0:
        return "cpu"
    if t.num_gpu == 1:
        return "share" if t.gpu_milli < MILLI else "whole"
    return "multi"


@lru_cache(maxsize=4)
def _spec_pool(path: str) -> dict[str, tuple[tuple[tuple[str, ...], int], ...]]:
    """Published spec strings by task kind, with their counts, in first-seen order."""
    by_kind: dict[str, Counter[tuple[str, ...]]] = {"share": Counter(), "whole": Counter(), "multi": Counter()}
    for t in load_tasks(path):
        if t.gpu_spec and kind(t) != "cpu":
            by_kind[kind(t)][t.gpu_spec] += 1
    return {k: tuple(c.items()) for k, c in by_kind.items()}


@lru_cache(maxsize=4)
def default_nodes() -> tuple[TraceNode, ...]:
    """The shipped openb node list (what every variant is meant for)."""
    return tuple(load_nodes(DATA_DIR / "openb_node_list_gpu_node.csv"))


def _fits(t: TraceTask, spec: tuple[str, ...], nodes: Sequence[TraceNode]) -> bool:
    allowed = set(spec)
    return any(n.model in allowed and n.gpu_count >= t.num_gpu and n.cpu_milli >= t.cpu_milli
               and n.memory_mib >= t.memory_mib for n in nodes)


def _count(pct: float, n: int) -> int:
    if not 0.0 <= pct <= 100.0:
        raise ValueError(f"pct must be in 0..100, got {pct}")
    return int(round(pct / 100.0 * n))


def _gpushare(tasks: Sequence[TraceTask], pct: float, rng: np.random.Generator) -> list[TraceTask]:
    share_pool = [t for t in tasks if kind(t) == "share"]
    whole_pool = [t for t in tasks if kind(t) in ("whole", "multi")]
    gpu_pos = [i for i, t in enumerate(tasks) if kind(t) != "cpu"]
    n_share = _count(pct, len(gpu_pos))
    if (n_share and not share_pool) or (n_share < len(gpu_pos) and not whole_pool):
        raise ValueError("the trace lacks sharing or whole-GPU tasks to draw from")
    is_share = np.zeros(len(gpu_pos), dtype=bool)
    is_share[rng.choice(len(gpu_pos), size=n_share, replace=False)] = True
    out = list(tasks)
    for j, i in enumerate(gpu_pos):
        pool = share_pool if is_share[j] else whole_pool
        src = pool[int(rng.integers(len(pool)))]
        out[i] = replace(src, name=tasks[i].name)
    return out


def multi_share(tasks: Sequence[TraceTask]) -> float:
    """Share of the GPU demand (sum k*d) carried by multi-GPU tasks."""
    total = sum(t.total_gpu_milli for t in tasks)
    return 0.0 if total == 0 else sum(t.total_gpu_milli for t in tasks if kind(t) == "multi") / total


def _multigpu(tasks: Sequence[TraceTask], pct: float, rng: np.random.Generator) -> list[TraceTask]:
    _count(pct, 1)  # range check
    if pct >= 100.0:
        raise ValueError("multigpu pct must be below 100")
    pool = [t for t in tasks if kind(t) == "multi"]
    out = list(tasks)
    total = sum(t.total_gpu_milli for t in tasks)
    multi = sum(t.total_gpu_milli for t in pool)
    target = pct / 100.0
    if total and multi / total >= target:
        return out
    if not pool:
        raise ValueError("the trace has no multi-GPU task to copy")
    names = {t.name for t in tasks}
    nxt = len(tasks)
    while multi / total < target:
        src = pool[int(rng.integers(len(pool)))]
        name = f"openb-pod-{nxt:04d}"
        while name in names:
            nxt += 1
            name = f"openb-pod-{nxt:04d}"
        names.add(name)
        nxt += 1
        out.append(replace(src, name=name))
        total += src.total_gpu_milli
        multi += src.total_gpu_milli
    return out


def _gpuspec(tasks: Sequence[TraceTask], pct: float, rng: np.random.Generator,
             nodes: Sequence[TraceNode], spec_source: Path) -> list[TraceTask]:
    pools = _spec_pool(str(spec_source))
    node_models = {n.model for n in nodes if n.gpu_count > 0}
    # Only specs naming node-list models (the published ones all do; a foreign node list may not).
    pools = {k: tuple((s, c) for s, c in v if set(s) <= node_models) for k, v in pools.items()}
    everything = tuple(p for v in pools.values() for p in v)
    gpu_pos = [i for i, t in enumerate(tasks) if kind(t) != "cpu"]
    want = _count(pct, len(gpu_pos))
    out = list(tasks)
    done = 0
    fit_cache: dict[tuple[int, int, int, tuple[str, ...]], bool] = {}
    for j in rng.permutation(len(gpu_pos)):
        if done == want:
            break
        i = gpu_pos[int(j)]
        t = tasks[i]
        res = (t.num_gpu, t.cpu_milli, t.memory_mib)

        def ok(spec: tuple[str, ...], t: TraceTask = t, res: tuple[int, int, int] = res) -> bool:
            key = (*res, spec)
            if key not in fit_cache:
                fit_cache[key] = _fits(t, spec, nodes)
            return fit_cache[key]

        cands = [(s, c) for s, c in pools[kind(t)] if ok(s)] or [(s, c) for s, c in everything if ok(s)]
        if not cands:
            continue
        w = np.array([c for _, c in cands], dtype=np.float64)
        spec = cands[int(rng.choice(len(cands), p=w / w.sum()))][0]
        out[i] = replace(t, gpu_spec=spec)
        done += 1
    return out


def _cpuheavy(tasks: Sequence[TraceTask], pct: float, rng: np.random.Generator,
              nodes: Sequence[TraceNode]) -> list[TraceTask]:
    cap = max(n.cpu_milli for n in nodes)
    out = list(tasks)
    for i in rng.choice(len(tasks), size=_count(pct, len(tasks)), replace=False):
        t = tasks[int(i)]
        out[int(i)] = replace(t, cpu_milli=min(cap, int(round(t.cpu_milli * CPU_FACTOR))))
    return out


def make_variant(tasks: Sequence[TraceTask], family: str, pct: float, seed: int,
                 nodes: Sequence[TraceNode] | None = None,
                 spec_source: str | Path = SPEC_SOURCE_CSV) -> list[TraceTask]:
    """A variant of `tasks` (see the module docstring for each family's meaning of pct). Pure and seeded.

    nodes: the node list the variant is meant for (default: the shipped openb node list); gpuspec names only
    its models and cpuheavy caps at its largest CPU. spec_source: the pod list the gpuspec strings come from.
    """
    rng = np.random.default_rng(seed)
    node_list = list(nodes) if nodes is not None else list(default_nodes())
    if family == "default":
        return list(tasks)
    if family == "gpushare":
        return _gpushare(tasks, pct, rng)
    if family == "multigpu":
        return _multigpu(tasks, pct, rng)
    if family == "gpuspec":
        return _gpuspec(tasks, pct, rng, node_list, Path(spec_source))
    if family == "cpuheavy":
        return _cpuheavy(tasks, pct, rng, node_list)
    raise ValueError(f"unknown family {family!r}; known: {', '.join(FAMILIES)}")


# ------------------------------------------------------------------------------------------------ the suite
@dataclass(frozen=True)
class Variant:
    """One suite entry: a family, its setting and the generator seed (replay seeds are separate)."""

    family: str
    pct: float
    gen_seed: int

    @property
    def name(self) -> str:
        return "default" if self.family == "default" else f"{self.family}{self.pct:g}-g{self.gen_seed}"

    def tasks(self, base: Sequence[TraceTask]) -> list[TraceTask]:
        return make_variant(base, self.family, self.pct, self.gen_seed)


# Tuning settings: what a policy may be tuned on (the default trace included).
TUNING: tuple[Variant, ...] = (
    Variant("default", 0, 0),
    Variant("gpushare", 40, 1401),
    Variant("gpushare", 60, 1402),
    Variant("multigpu", 30, 1403),
    Variant("multigpu", 50, 1404),
    Variant("gpuspec", 20, 1405),
    Variant("gpuspec", 33, 1406),
    Variant("cpuheavy", 20, 1407),
)
# Held out: other settings and other generator seeds; report separately, never tune on them.
HELD_OUT: tuple[Variant, ...] = (
    Variant("gpushare", 20, 2401),
    Variant("gpushare", 80, 2402),
    Variant("multigpu", 40, 2403),
    Variant("multigpu", 60, 2404),
    Variant("gpuspec", 25, 2405),
    Variant("gpuspec", 40, 2406),
    Variant("cpuheavy", 10, 2407),
    Variant("cpuheavy", 30, 2408),
)
# Tuning twins (session 7): the two held-out settings where the default fell short of the target (multigpu60)
# or lost to its own earlier form (cpuheavy30), drawn again with tuning seeds, so their cause can be looked
# for without opening the held-out samples. Choosing these settings used what the held-out table showed, so
# FRESH below replaces HELD_OUT as the figure that counts for any change tuned on them.
TWINS: tuple[Variant, ...] = (
    Variant("multigpu", 60, 1409),
    Variant("cpuheavy", 30, 1410),
)
# Fresh held-out rows (session 7): HELD_OUT's eight settings with generator seeds never run before any change
# of that session was chosen; reported separately, never tuned on.
FRESH: tuple[Variant, ...] = tuple(Variant(v.family, v.pct, 3401 + i) for i, v in enumerate(HELD_OUT))
# A second fresh set (session 8): the same settings with generator seeds 4401-4408, drawn after session 8's change
# (the homes term) was chosen on the tuning rows. HELD_OUT and FRESH had been seen by then (the held-out miss is
# what sent session 7 to the twins), so this set is the one no choice so far has seen.
FRESH8: tuple[Variant, ...] = tuple(Variant(v.family, v.pct, 4401 + i) for i, v in enumerate(HELD_OUT))
SUITES: dict[str, tuple[Variant, ...]] = {"tuning": TUNING + TWINS, "held-out": HELD_OUT, "fresh": FRESH,
                                          "fresh8": FRESH8, "all": TUNING + TWINS + HELD_OUT + FRESH + FRESH8}


def variant(name: str) -> Variant:
    """The suite entry named `name` (`Variant.name`, e.g. 'multigpu50-g1404'); unknown names raise KeyError
    listing the known ones."""
    by_name = {v.name: v for v in SUITES["all"]}
    try:
        return by_name[name]
    except KeyError:
        raise KeyError(f"unknown variant {name!r}; known: {', '.join(by_name)}") from None


def suite(name: str) -> tuple[Variant, ...]:
    try:
        return SUITES[name]
    except KeyError:
        raise KeyError(f"unknown suite {name!r}; known: {', '.join(SUITES)}") from None


def default_tasks() -> list[TraceTask]:
    return load_tasks(DATA_DIR / "openb_pod_list_default.csv")
