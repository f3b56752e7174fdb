"""ResourceClaims and gated pods as users write them, and a one-GPU node's slice and class, for the tests that run
vramfit's DRA allocator live."""

from __future__ import annotations

from typing import Any

from packing.dra.objects import GATE


def claim(ns: str, name: str, cls: str = "gpu.nvidia.com", memory: str | None = None) -> dict[str, Any]:
    """A ResourceClaim with one request `gpu` of the class, asking `memory` when given."""
    exactly: dict[str, Any] = {"deviceClassName": cls}
    if memory:
        exactly["capacity"] = {"requests": {"memory": memory}}
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name, "namespace": ns},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}}


def gated_pod(ns: str, name: str, claim: str | None = None, template: str | None = None,
              annotations: dict[str, str] | None = None) -> dict[str, Any]:
    """A pod the webhook gated, its one container using the claim (by name, or made from `template`)."""
    entry: dict[str, Any] = {"name": "gpu"}
    if claim:
        entry["resourceClaimName"] = claim
    else:
        entry["resourceClaimTemplateName"] = template
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns, "annotations": annotations or {}},
            "spec": {"schedulingGates": [{"name": GATE}], "resourceClaims": [entry],
                     "containers": [{"name": "main", "image": "vllm", "resources": {"claims": [{"name": "gpu"}]}}]}}


# One node whose one whole H100 the NVIDIA driver publishes, and the class of whole GPUs.
ONE_GPU_SLICE = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": "node-a-gpus"},
         "spec": {"driver": "gpu.nvidia.com", "nodeName": "node-a",
                  "pool": {"name": "node-a", "generation": 1, "resourceSliceCount": 1},
                  "devices": [{"name": "gpu-0", "attributes": {
                      "type": {"string": "gpu"}, "uuid": {"string": "GPU-4a2f0c1e-8d3b-5e7a-9c61-0b2d4e6f8a13"},
                      "productName": {"string": "NVIDIA H100 80GB HBM3"}},
                      "capacity": {"memory": {"value": "81559Mi"}}}]}}
GPU_CLASS = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "gpu.nvidia.com"},
         "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com' && "
                                                       "device.attributes['gpu.nvidia.com'].type == 'gpu'"}}]}}
