"""The summary of a what-if placement (pods placed, GPUs used, stranded and free VRAM): what `vramfit whatif`
reports for the online policy and for the plan alike."""

from __future__ import annotations

from typing import Any

from packing.place import Decision
from packing.state import ClusterState


def summary_json(state: ClusterState, decisions: list[Decision], policy_name: str) -> dict[str, Any]:
    placed = sum(1 for d in decisions if d.node)
    present = state.present
    return {
        "policy": policy_name,
        "placed": placed,
        "unplaced": len(decisions) - placed,
        "gpus_used": state.gpus_used(),
        "gpus_total": int(present.sum()),
        "stranded_vram_mib": state.stranded_mib(),
        "free_vram_mib": int(state.pool_free[present].sum()),
        "requested_vram_mib": sum(d.pod.vram_mib * d.pod.gpu_count for d in decisions if d.node),
    }
