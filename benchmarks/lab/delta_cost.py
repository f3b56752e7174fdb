"""Cost of one incremental `DeltaSource.delta` on a large state: what the queue planner holds the store's lock for
after its first copy (issue 13).

    python -m benchmarks.lab.delta_cost [--nodes 5000] [--running 15000] [--moved 10] [--rounds 30]

Builds the extender benchmark's cluster (`benchmarks.bench_extender.make_node`), books `--running` pods of 4 GiB
round-robin, takes a full copy, then `--rounds` times releases and re-books `--moved` pods and times one delta.
Prints the median and the largest, in milliseconds. Measured here, never asserted in tests.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence

from benchmarks.bench_extender import make_node
from extender.store import Store
from packing import fit
from packing.catalog import load_catalog
from packing.model import PodDemand
from packing.planning.working_copy import DeltaSource


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--running", type=int, default=15000)
    ap.add_argument("--moved", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=30)
    args = ap.parse_args(argv)
    store = Store.from_objects([make_node(k) for k in range(args.nodes)], load_catalog())
    state = store.state
    names = state.node_names
    for i in range(args.running):
        pod = PodDemand(key=f"bench/p{i}", vram_mib=4096, tenant="bench")
        units = fit.choose_units(state, names[i % len(names)], pod)
        if units is not None:
            state.allocate(pod, units)
    source = DeltaSource()
    while not source.delta(state, store.node_set_version, max_rows=64).complete:
        pass
    keys = list(state._holders)[: args.moved]
    took = []
    for _ in range(args.rounds):
        for k in keys:
            h = state.release(k)
            if h is not None:
                state.allocate(h.pod, h.assignment)
        t0 = time.perf_counter()
        source.delta(state, store.node_set_version, max_rows=64)
        took.append(1000 * (time.perf_counter() - t0))
    print(f"{len(state)} nodes, {len(state._holders)} pods running, {args.moved} moved per round: delta "
          f"median {statistics.median(took):.3f} ms, max {max(took):.3f} ms over {args.rounds} rounds")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
