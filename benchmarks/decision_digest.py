"""A digest of every placement decision, pod by pod, to prove a refactoring changed nothing but the shape.

Four streams of decisions, each reduced to one sha256 over `pod -> node + units` lines in decision order:

(a) `demo`: `vramfit.demo.compare` for the default policy (whole-GPU baseline and vramfit);
(b) `whatif:<policy>:<cluster>+<pods>`: what `vramfit whatif` places (load the snapshot and the pods, place in
    order, `placement_json`), for every policy, on every cluster/pods pair of files under `tests/fixtures`
    and `vramfit/data` that whatif accepts (the ones it refuses are listed under "skipped"); a policy that
    takes a seed gets seed 0, since whatif gives none and an unseeded random policy draws anew every run;
(c) `extender`: the demo cluster in an `extender.store.Store`, then filter -> prioritize -> bind for each demo
    pod through `extender.service.Extender` in-process (the highest score among the nodes that passed, ties to
    the first), recording the bind answer and the units the store booked;
(d) `replay:<policy>:<seed>`: `benchmarks.replay.replay` of the full default trace (1,213 nodes, tune 1.3,
    ~10,000 pods a run) for seeds 42 and 43 with every registered policy, recording each pod's node and
    units: all 28 runs take about 1.5 minutes on two cores, so nothing is cut. `--nodes N` keeps only the
    first N trace nodes and `--tasks K` stops each run after K pods, for a quicker look.

Usage: python -m benchmarks.decision_digest [--out FILE] [--compare BEFORE.json]
With --compare the run exits 1 and lists the streams whose digest differs from BEFORE.json (or that are
missing); streams BEFORE.json lacks are listed as new.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
FIXTURE_DIRS = (ROOT / "tests" / "fixtures", ROOT / "vramfit" / "data")
SEEDS = (42, 43)


def _digest(lines: Iterable[str]) -> tuple[str, int]:
    h = hashlib.sha256()
    n = 0
    for line in lines:
        h.update(line.encode())
        h.update(b"\n")
        n += 1
    return h.hexdigest(), n


def _placement_line(p: dict[str, Any]) -> str:
    units = ",".join(f"{g['index']}:{g.get('mig')}:{g['vram_mib']}" for g in p["gpus"])
    return f"{p['pod']} -> {p['node']} [{units}] {p['reason'] or ''}"


# ------------------------------------------------------------------------------------------------- (a)
def demo_streams() -> dict[str, dict[str, Any]]:
    from packing.policies import DEFAULT_POLICY
    from vramfit.demo import compare

    runs = compare(DEFAULT_POLICY)
    out = {}
    for name, run in runs.items():
        d, n = _digest(_placement_line(p) for p in run["placements"])
        out[f"demo:{name}"] = {"sha256": d, "decisions": n}
    return out


# ------------------------------------------------------------------------------------------------- (b)
def _fixture_files() -> list[Path]:
    files: list[Path] = []
    for base in FIXTURE_DIRS:
        files += sorted(p for p in base.rglob("*") if p.suffix in (".yaml", ".yml", ".json") and p.is_file())
    return files


def _whatif(state: Any, pending: list[Any], policy: str) -> list[dict[str, Any]]:
    """`vramfit whatif`'s placements (`simulate` without its summary), with seed 0 for a policy that takes a
    seed: whatif gives none, and a random policy would draw a new placement every run (paper:random does)."""
    from packing.place import place_all
    from packing.policies import get_policy
    from vramfit.whatif import placement_json, simulate

    try:
        pol = get_policy(policy, seed=0)
    except TypeError:
        return list(simulate(state, pending, policy)["placements"])
    return [placement_json(d) for d in place_all(state, pending, pol)]


def whatif_streams(skipped: list[str]) -> dict[str, dict[str, Any]]:
    from kubeio.files import CliError
    from packing.model import InputError
    from packing.policies import policy_names
    from vramfit.whatif import load_catalog_arg, load_cluster, load_pending

    catalog = load_catalog_arg(None)
    files = _fixture_files()
    pods_files: list[Path] = []
    for f in files:
        try:
            load_pending(str(f))
            pods_files.append(f)
        except (CliError, InputError, ValueError, KeyError, TypeError):
            continue
    out: dict[str, dict[str, Any]] = {}
    for cluster in files:
        try:
            state, _ = load_cluster(str(cluster), catalog)
        except (CliError, InputError, ValueError, KeyError, TypeError) as err:
            skipped.append(f"whatif cluster {cluster.relative_to(ROOT)}: {str(err).replace(str(ROOT) + '/', '')}")
            continue
        if len(state) == 0:
            skipped.append(f"whatif cluster {cluster.relative_to(ROOT)}: no nodes")
            continue
        for pods in pods_files:
            for policy in policy_names():
                st = state.copy()
                try:
                    placements = _whatif(st, load_pending(str(pods)), policy)
                except (CliError, InputError) as err:
                    skipped.append(f"whatif {policy} {cluster.name}+{pods.name}: {err}")
                    continue
                d, n = _digest(_placement_line(p) for p in placements)
                key = f"whatif:{policy}:{cluster.relative_to(ROOT)}+{pods.relative_to(ROOT)}"
                out[key] = {"sha256": d, "decisions": n}
    return out


# ------------------------------------------------------------------------------------------------- (c)
def extender_stream() -> dict[str, dict[str, Any]]:
    from extender import wire
    from extender.binder import MemoryBinder
    from extender.metrics import Metrics
    from extender.service import Extender
    from extender.store import Store
    from kubeio.files import read_yaml_documents
    from packing.policies import DEFAULT_POLICY, get_policy
    from vramfit.demo import DEMO_CLUSTER, DEMO_PODS
    from vramfit.whatif import load_catalog_arg

    catalog = load_catalog_arg(None)
    cluster = read_yaml_documents(str(DEMO_CLUSTER))
    pods = [p for p in read_yaml_documents(str(DEMO_PODS)) if isinstance(p, dict) and p.get("kind") == "Pod"]
    store = Store.from_objects(copy.deepcopy(cluster), catalog)
    ext = Extender(store, MemoryBinder(), get_policy(DEFAULT_POLICY), Metrics(store))
    names = list(store.state.node_names)
    lines: list[str] = []
    for pod in pods:
        meta = pod["metadata"]
        key = f"{meta.get('namespace', 'default')}/{meta['name']}"
        args = wire.ExtenderArgs(Pod=pod, NodeNames=names)
        filtered = ext.filter(args)
        passed = list(filtered.get("NodeNames") or [])
        failed = filtered.get("FailedNodes") or {}
        never = filtered.get("FailedAndUnresolvableNodes") or {}
        lines.append(f"{key} filter passed={passed} failed={sorted(failed.items())} never={sorted(never.items())}")
        if not passed:
            continue
        scores = json.loads(ext.prioritize(wire.ExtenderArgs(Pod=pod, NodeNames=passed)))
        lines.append(f"{key} prioritize {[(s['Host'], s['Score']) for s in scores]}")
        best = max(range(len(scores)), key=lambda k: (scores[k]["Score"], -k))
        node = scores[best]["Host"]
        answer = ext.bind(wire.ExtenderBindingArgs(PodName=meta["name"], PodNamespace=meta.get("namespace", "default"),
                                                   PodUID=meta.get("uid", ""), Node=node))
        held = store.state.holder(key)
        units = "" if held is None else ",".join(f"{g.index}:{g.mig}:{g.vram_mib}" for g in held.assignment.gpus)
        lines.append(f"{key} bind {node} error={answer.get('Error', '')!r} -> "
                     f"{None if held is None else held.assignment.node} [{units}]")
    d, n = _digest(lines)
    return {"extender": {"sha256": d, "decisions": n}}


# ------------------------------------------------------------------------------------------------- (d)
def replay_streams(tasks: int, nodes: int, progress: bool) -> dict[str, dict[str, Any]]:
    from benchmarks import replay as rp
    from benchmarks.trace import load_nodes, load_tasks
    from packing.policies import policy_names

    all_nodes = load_nodes(rp.DEFAULT_NODES_CSV)
    if nodes > 0:
        all_nodes = all_nodes[:nodes]
    all_tasks = load_tasks(rp.DEFAULT_PODS_CSV)
    out: dict[str, dict[str, Any]] = {}
    for policy in policy_names():
        for seed in SEEDS:
            lines: list[str] = []
            seen = [0]

            def on_step(state: Any, pod: Any, node: str | None, lines: list[str] = lines,
                        seen: list[int] = seen) -> None:
                seen[0] += 1
                held = state.holder(pod.key) if node is not None else None
                units = "" if held is None else ",".join(f"{g.index}:{g.mig}:{g.vram_mib}"
                                                         for g in held.assignment.gpus)
                lines.append(f"{pod.key} -> {node} [{units}]")
                if 0 < tasks <= seen[0]:
                    raise _Enough

            t0 = time.perf_counter()
            try:
                rp.replay(all_nodes, all_tasks, policy, seed, on_step=on_step)
            except _Enough:
                pass
            d, n = _digest(lines)
            out[f"replay:{policy}:{seed}"] = {"sha256": d, "decisions": n}
            if progress:
                print(f"replay {policy} seed {seed}: {n} pods, {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return out


class _Enough(Exception):
    """Stops a replay once the prefix is recorded."""


def _register_peers() -> None:
    """The FGD paper's policies and vramfit's research variants, in the registry for every stream (the core had
    them built in before they moved to the benchmark, so a digest of an older tree runs the same set)."""
    try:
        from benchmarks import peers
    except ModuleNotFoundError:
        return  # a tree from before the move: the core registers them itself
    peers.register()
    try:
        from benchmarks import research_policies
    except ModuleNotFoundError:
        return
    research_policies.register()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="write the digests as JSON here (default: stdout)")
    ap.add_argument("--compare", help="a digest file to compare with; exit 1 on any difference")
    ap.add_argument("--tasks", type=int, default=0, help="stop each replay after this many pods (0: all)")
    ap.add_argument("--nodes", type=int, default=0, help="first trace nodes kept for the replay (0: all)")
    ap.add_argument("--skip-replay", action="store_true", help="streams (a)-(c) only (quick check)")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)
    _register_peers()
    skipped: list[str] = []
    streams: dict[str, dict[str, Any]] = {}
    streams.update(demo_streams())
    streams.update(whatif_streams(skipped))
    streams.update(extender_stream())
    if not args.skip_replay:
        streams.update(replay_streams(args.tasks, args.nodes, not args.quiet))
    doc = {"replay_tasks": args.tasks, "replay_nodes": args.nodes, "streams": dict(sorted(streams.items())),
           "skipped": skipped}
    text = json.dumps(doc, indent=2) + "\n"
    if args.out:
        Path(args.out).write_text(text)
    else:
        sys.stdout.write(text)
    if args.compare:
        before = json.loads(Path(args.compare).read_text())["streams"]
        if args.skip_replay:
            before = {k: v for k, v in before.items() if not k.startswith("replay:")}
        # A stream that changed or went missing fails; a new one (a run others added since, e.g. a third
        # demo baseline) is listed and does not: it has no "before" to be identical to.
        diff = sorted(k for k in before if before[k] != streams.get(k))
        new = sorted(k for k in streams if k not in before)
        for k in diff:
            print(f"DIFFERS {k}: before {before[k]} now {streams.get(k)}", file=sys.stderr)
        for k in new:
            print(f"NEW {k}: {streams[k]}", file=sys.stderr)
        print(f"{len(before)} streams compared, {len(diff)} differ, {len(new)} new", file=sys.stderr)
        return 1 if diff else 0
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
