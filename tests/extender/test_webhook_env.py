"""The webhook refuses a vramfit pod whose containers set the GPU limits the node agent hands over (HAMi-core's
`CUDA_DEVICE_MEMORY_LIMIT*`, `CUDA_DEVICE_MEMORY_SHARED_CACHE`, `CUDA_DEVICE_SM_LIMIT`, `CUDA_DISABLE_CONTROL`):
a container's own value would override the booking. Over real HTTP (uvicorn on loopback), AdmissionReview in
and out, as tests/extender/test_webhook.py does; the denial names the pod, the container and the variable."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packing.k8s.pod_keys import LIMIT_ENV, is_limit_env
from tests.extender.test_webhook import GPU, PREFIX, VRAM, Served, review


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    s = Served()
    yield s
    s.close()


def admit(served: Served, pod: dict[str, Any]) -> dict[str, Any]:
    """POST an AdmissionReview for the pod's CREATE; the AdmissionResponse."""
    r = served.post(review(pod), path=f"{PREFIX}/mutate")
    assert r.status_code == 200, r.text
    response: dict[str, Any] = r.json()["response"]
    return response


def container(name: str, env: dict[str, str] | None = None, resources: dict[str, str] | None = None
              ) -> dict[str, Any]:
    c: dict[str, Any] = {"name": name, "image": "vllm/vllm-openai"}
    if env is not None:
        c["env"] = [{"name": "HF_HOME", "value": "/cache"}] + [{"name": k, "value": v} for k, v in env.items()]
    if resources is not None:
        c["resources"] = {"limits": dict(resources)}
    return c


def pod(*containers: dict[str, Any], init: list[dict[str, Any]] | None = None,
        annotations: dict[str, str] | None = None, scheduler: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": list(containers)}
    if init:
        spec["initContainers"] = init
    if scheduler:
        spec["schedulerName"] = scheduler
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "team-a", "annotations": annotations or {}}, "spec": spec}


@pytest.mark.parametrize("variable", ["CUDA_DEVICE_MEMORY_LIMIT", "CUDA_DEVICE_MEMORY_LIMIT_0",
                                      "CUDA_DEVICE_MEMORY_LIMIT_3", *sorted(LIMIT_ENV)])
def test_a_vram_pod_setting_a_limit_itself_is_refused_naming_container_and_variable(served: Served,
                                                                                   variable: str) -> None:
    answer = admit(served, pod(container("sidecar"), container("server", {variable: "80g"}, {VRAM: "12Gi"})))
    assert not answer["allowed"]
    status = answer["status"]
    assert status["code"] == 403
    message = status["message"]
    assert "team-a/p" in message and "spec.containers[1].env[1]" in message
    assert "'server'" in message and variable in message


def test_an_init_container_and_a_gpu_only_pod_are_held_to_it_too(served: Served) -> None:
    init = admit(served, pod(container("main", resources={VRAM: "8Gi"}),
                            init=[container("warmup", {"CUDA_DISABLE_CONTROL": "true"})]))
    assert not init["allowed"]
    assert "spec.initContainers[0].env[1]" in init["status"]["message"] and "'warmup'" in init["status"]["message"]
    gpu_only = admit(served, pod(container("main", {"CUDA_DEVICE_SM_LIMIT": "100"}, {GPU: "1"})))
    assert not gpu_only["allowed"] and "CUDA_DEVICE_SM_LIMIT" in gpu_only["status"]["message"]
    by_annotation = admit(served, pod(container("main", {"CUDA_DEVICE_MEMORY_LIMIT_1": "1g"}),
                                     annotations={VRAM: "8Gi"}))
    assert not by_annotation["allowed"]


def test_pods_vramfit_does_not_place_and_other_cuda_variables_pass(served: Served) -> None:
    # Not vramfit's pod: no GPU of vramfit's is handed to it, so nothing of vramfit's is overridden.
    assert admit(served, pod(container("main", {"CUDA_DEVICE_MEMORY_LIMIT": "4g"})))["allowed"]
    other = admit(served, pod(container("main", {"CUDA_DEVICE_MEMORY_LIMIT": "4g"}, {VRAM: "8Gi"}),
                             scheduler="gang-scheduler"))
    assert other["allowed"] and "left alone" in " ".join(other.get("warnings") or [])
    fine = admit(served, pod(container("main", {"CUDA_VISIBLE_DEVICES": "0", "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
                                                "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
                                      {VRAM: "8Gi"})))
    assert fine["allowed"]


@settings(max_examples=60, deadline=None)
@given(st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZ_0123456789", min_size=1, max_size=40))
def test_the_rule_is_the_documented_names_exactly(name: str) -> None:
    expected = name in LIMIT_ENV or name.startswith("CUDA_DEVICE_MEMORY_LIMIT")
    assert is_limit_env(name) == expected
