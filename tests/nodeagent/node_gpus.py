"""The node the Allocate tests run on: one GPU per mode, as the agent publishes them in `vramfit.io/gpus`."""

from __future__ import annotations

from typing import Any

NODE = "gpu-1"
PIPES = {"GPU-bbbb": "/run/nvidia/mps/GPU-bbbb/pipe"}  # the MPS GPU's daemon pipe directory


def node_gpus(*, mps_memory_mib: int, mps_replicas: int, timeslice_replicas: int) -> list[dict[str, Any]]:
    """A MIG A100 (two 3g.40gb instances), an MPS H100, a time-sliced T4 and an exclusive T4."""
    return [
        {"index": 0, "uuid": "GPU-aaaa", "product": "NVIDIA-A100-SXM4-80GB", "memory_mib": 81920, "mode": "mig",
         "mig": [{"profile": "3g.40gb", "start": 0, "uuid": "MIG-a0"}, {"profile": "3g.40gb", "start": 4,
                                                                      "uuid": "MIG-a4"}]},
        {"index": 1, "uuid": "GPU-bbbb", "product": "NVIDIA-H100-80GB-HBM3", "memory_mib": mps_memory_mib,
         "mode": "mps", "replicas": mps_replicas},
        {"index": 2, "uuid": "GPU-cccc", "product": "Tesla-T4", "memory_mib": 15360, "mode": "timeslice",
         "replicas": timeslice_replicas},
        {"index": 3, "uuid": "GPU-dddd", "product": "Tesla-T4", "memory_mib": 15360, "mode": "exclusive"},
    ]
