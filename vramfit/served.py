"""Which nodes of a cluster the CLI counts: those the vramfit node agent serves, as the live extender does."""

from __future__ import annotations

from typing import Any

from packing.k8s.inventory import AGENT_RESOURCE
from packing.state import ClusterState


def count_served(state: ClusterState, unserved: dict[str, str], source: str, strict: bool
                 ) -> tuple[dict[str, Any], list[str]]:
    """Keep in `state` only the nodes the node agent serves, as the live extender does: kube-scheduler offers
    vramfit pods no other node. Returns which nodes were counted and why (JSON), and warnings.

    strict=False (a what-if on a snapshot): a snapshot where no node has the agent is a cluster before vramfit
    is installed, so every node is counted, as if the agent ran on all of them, and the warning says so.
    strict=True (`inspect` on a live cluster): only served nodes, always."""
    names = list(state.node_names)
    absent = {n: unserved[n] for n in names if n in unserved}
    gpu_absent = [n for n in absent if state.node(n).gpus]
    if not absent:
        return {"counted": names, "not_counted": {},
                "rule": f"every node advertises {AGENT_RESOURCE}: the node agent serves it"}, []
    if len(absent) == len(names) and not strict:
        rule = (f"no node advertises {AGENT_RESOURCE} (vramfit not installed yet?): every node counted as if "
                "the node agent ran on it")
        return {"counted": names, "not_counted": {}, "rule": rule}, [f"{source}: {rule}"]
    for name in absent:
        state.remove_node(name)
    rule = (f"only nodes advertising {AGENT_RESOURCE} (the node agent serves them) are counted: kube-scheduler "
            "offers vramfit pods no other node")
    warnings = []
    if gpu_absent:
        shown = ", ".join(gpu_absent[:10]) + (f" (+{len(gpu_absent) - 10} more)" if len(gpu_absent) > 10 else "")
        warnings.append(f"{source}: GPU node{'s' if len(gpu_absent) > 1 else ''} {shown} not counted: no "
                        f"{AGENT_RESOURCE} in status.allocatable (the vramfit node agent does not run there)")
    return {"counted": [n for n in names if n not in absent], "not_counted": absent, "rule": rule}, warnings
