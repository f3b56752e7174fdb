"""Every spelling of a vramfit request is read or refused: no key is silently ignored (packing/k8s/pod_keys.py)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from packing.k8s.demand import pod_demand
from packing.k8s.pod_keys import POD_ANNOTATIONS, POD_LABELS, RESOURCES, check_extended_resources
from packing.model import InputError, Isolation


def _pod(annotations: dict[str, str] | None = None, labels: dict[str, str] | None = None,
         resources: dict[str, Any] | None = None) -> dict[str, Any]:
    res = resources if resources is not None else {"limits": {"vramfit.io/vram": "14Gi"}}
    return {"metadata": {"name": "p", "namespace": "ml", "annotations": annotations or {}, "labels": labels or {}},
            "spec": {"containers": [{"name": "c", "resources": res}]}}


@pytest.mark.parametrize(("where", "key", "hint"), [
    ("annotations", "vramfit.io/isolaton", "vramfit.io/isolation"),
    ("annotations", "vramfit.io/gpu-model", "vramfit.io/gpu-models"),
    ("annotations", "vramfit.io/gpu", "vramfit.io/gpus"),
    ("labels", "vramfit.io/tenat", "vramfit.io/tenant"),
])
def test_a_misspelt_key_is_refused_with_the_key_it_was_meant_to_be(where: str, key: str, hint: str) -> None:
    pod = _pod(**{where: {key: "hardware"}})
    with pytest.raises(InputError, match=rf"metadata.{where}\[{key}\]: .*did you mean '{hint}'"):
        pod_demand(pod)


def test_a_misspelt_resource_is_refused() -> None:
    pod = _pod(resources={"limits": {"vramfit.io/vram": "1Gi", "vramfit.io/vrams": "1Gi"}})
    with pytest.raises(InputError, match=r"resources.limits\[vramfit.io/vrams\].*did you mean 'vramfit.io/vram'"):
        pod_demand(pod)


def test_a_label_used_as_an_annotation_is_pointed_at_its_place() -> None:
    with pytest.raises(InputError, match="not read as an annotation"):
        pod_demand(_pod(annotations={"vramfit.io/tenant": "ml"}))


@given(st.sampled_from(sorted(POD_ANNOTATIONS | POD_LABELS | RESOURCES)), st.integers(0, 20), st.characters(
    whitelist_categories=("Ll",)))
def test_no_near_spelling_of_a_key_passes_unread(key: str, at: int, char: str) -> None:
    """Insert a letter anywhere after the prefix: the pod is refused, or the result is another known key."""
    cut = len("vramfit.io/") + at % (len(key) - len("vramfit.io/") + 1)
    typo = key[:cut] + char + key[cut:]
    if typo in POD_ANNOTATIONS:
        return
    pod = _pod(annotations={typo: "x"})
    with pytest.raises(InputError, match="vramfit"):
        pod_demand(pod)


def test_known_keys_still_read() -> None:
    demand = pod_demand(_pod(annotations={"vramfit.io/isolation": "hardware"}, labels={"vramfit.io/webhook": "on"}))
    assert demand is not None and demand.isolation is Isolation.HARDWARE


def test_vram_in_requests_needs_the_same_limit() -> None:
    spec = _pod(resources={"requests": {"vramfit.io/vram": "14Gi"}})["spec"]
    with pytest.raises(InputError, match=r"limits\[vramfit.io/vram\]: missing: .*extended resource"):
        check_extended_resources(spec, "pod ml/p")
    spec = _pod(resources={"requests": {"vramfit.io/vram": "14Gi"}, "limits": {"vramfit.io/vram": "16Gi"}})["spec"]
    with pytest.raises(InputError, match=r"requests\[vramfit.io/vram\]: '14Gi' differs from the limit '16Gi'"):
        check_extended_resources(spec, "pod ml/p")
    same = _pod(resources={"requests": {"vramfit.io/vram": "14Gi"}, "limits": {"vramfit.io/vram": "14336Mi"}})
    check_extended_resources(same["spec"], "pod ml/p")


def test_vram_written_twice_with_two_values_is_refused_and_once_agreeing_is_read() -> None:
    twice = _pod(annotations={"vramfit.io/vram": "16Gi"})
    with pytest.raises(InputError, match=r"annotations\[vramfit.io/vram\]: 16384 MiB, but .* ask for 14336 MiB"):
        pod_demand(twice)
    agreeing = _pod(annotations={"vramfit.io/vram": "14336"})
    assert pod_demand(agreeing).vram_mib == 14336  # type: ignore[union-attr]


@pytest.mark.parametrize("resource", ["nvidia.com/gpu", "nvidia.com/mig-3g.40gb", "nvidia.com/gpu.shared"])
def test_vram_beside_a_device_plugin_gpu_is_refused(resource: str) -> None:
    pod = _pod(resources={"limits": {"vramfit.io/vram": "14Gi", resource: "1"}})
    with pytest.raises(InputError, match=rf"limits\[{resource}\]: .*a second GPU nobody booked"):
        pod_demand(pod)
