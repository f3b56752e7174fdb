"""Pod JSON -> demand: resources, init containers, annotations, and errors that name pod and field."""

from __future__ import annotations

import json
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from packing.k8s.demand import pod_demand, pod_holding
from packing.k8s.quantity import MAX_VRAM_MIB, cpu_to_milli, parse_quantity, quantity_to_mib, vram_to_mib
from packing.k8s.trust import Tenancy
from packing.model import InputError, Isolation


def pod(containers=None, init=None, annotations=None, labels=None, ns="team-a", name="p") -> dict:
    meta: dict = {"name": name, "namespace": ns, "uid": "u-1"}
    if annotations:
        meta["annotations"] = annotations
    if labels:
        meta["labels"] = labels
    spec: dict = {"containers": containers or [{"name": "c", "image": "x"}]}
    if init:
        spec["initContainers"] = init
    return {"metadata": meta, "spec": spec, "status": {}}


def ctr(vram=None, section="requests", cpu=None):
    res: dict = {}
    if vram is not None:
        res["vramfit.io/vram"] = vram
    if cpu is not None:
        res["cpu"] = cpu
    return {"name": "c", "image": "x", "resources": {section: res}}


@pytest.mark.parametrize(("text", "mib"), [("14Gi", 14336), ("14336Mi", 14336), ("40G", 38147), ("1", 1),
                                           ("15032385536", 14336), ("1.5Gi", 1536), ("2e9", 1908)])
def test_quantities_convert_to_mib_rounding_up(text, mib) -> None:
    assert quantity_to_mib(text) == mib


def test_cpu_quantities() -> None:
    assert cpu_to_milli("250m") == 250 and cpu_to_milli("2") == 2000 and cpu_to_milli("0.5") == 500


@given(st.integers(0, 10**6), st.sampled_from(["Ki", "Mi", "Gi", "k", "M", "G", ""]))
def test_quantity_parse_is_exact(n, suffix) -> None:
    factor = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "k": 10**3, "M": 10**6, "G": 10**9, "": 1}[suffix]
    assert parse_quantity(f"{n}{suffix}") == Fraction(n * factor)


@pytest.mark.parametrize("bad", ["14GB", "abc", "", "1.2.3", "--1"])
def test_bad_quantities_are_rejected(bad) -> None:
    with pytest.raises(ValueError):
        parse_quantity(bad)


def test_vram_sums_containers_and_takes_init_peak() -> None:
    p = pod(containers=[ctr("6000"), ctr("4000", section="limits")], init=[ctr("12000")])
    d = pod_demand(p)
    assert d is not None and d.vram_mib == 12000  # init peak 12000 > sum 10000
    p = pod(containers=[ctr("6000"), ctr("8000")], init=[ctr("12000")])
    assert pod_demand(p).vram_mib == 14000  # type: ignore[union-attr]


def test_sidecar_init_containers_add_to_the_running_sum() -> None:
    sidecar = ctr("1000") | {"restartPolicy": "Always"}
    p = pod(containers=[ctr("5000")], init=[sidecar, ctr("3000")])
    assert pod_demand(p).vram_mib == 6000  # type: ignore[union-attr]


def test_annotation_quantity_tenant_isolation_models() -> None:
    p = pod(annotations={"vramfit.io/vram": "14Gi", "vramfit.io/gpus": "2", "vramfit.io/isolation": "process",
                         "vramfit.io/gpu-models": "NVIDIA-A100-SXM4-80GB, H100-80GB"},
            labels={"vramfit.io/tenant": "blue"})
    allows_blue = Tenancy.from_objects([{"metadata": {"name": "team-a",
                                                      "annotations": {"vramfit.io/allowed-tenants": "blue"}}}])
    d = pod_demand(p, allows_blue)
    assert d is not None
    assert (d.vram_mib, d.gpu_count, d.tenant, d.isolation) == (14336, 2, "blue", Isolation.PROCESS)
    assert d.models == frozenset({"nvidia-a100-sxm4-80gb", "h100-80gb"})
    assert pod_demand(pod()) is None
    assert pod_demand(pod(containers=[ctr("100")])).tenant == "team-a"  # type: ignore[union-attr]


def test_a_tenant_the_namespace_does_not_allow_is_refused_but_what_a_bound_pod_holds_stays_booked() -> None:
    p = pod(containers=[ctr("100")], labels={"vramfit.io/tenant": "blue"})
    with pytest.raises(InputError, match=r"metadata.labels\[vramfit.io/tenant\]: namespace team-a does not allow"):
        pod_demand(p)
    bound = p | {"spec": {**p["spec"], "nodeName": "n1"}}
    holding = pod_holding(bound)
    assert holding is not None and holding.pod.tenant == "team-a" and "does not allow" in holding.distrusted


@pytest.mark.parametrize(("annotations", "containers", "field"), [
    ({"vramfit.io/vram": "lots"}, None, "metadata.annotations[vramfit.io/vram]"),
    ({"vramfit.io/vram": "0"}, None, "metadata.annotations[vramfit.io/vram]"),
    ({"vramfit.io/vram": "1Gi", "vramfit.io/gpus": "two"}, None, "metadata.annotations[vramfit.io/gpus]"),
    ({"vramfit.io/vram": "1Gi", "vramfit.io/gpus": "0"}, None, "metadata.annotations[vramfit.io/gpus]"),
    ({"vramfit.io/vram": "1Gi", "vramfit.io/isolation": "strong"}, None, "metadata.annotations[vramfit.io/isolation]"),
    ({"vramfit.io/vram": "1Gi", "vramfit.io/gpu-models": " , "}, None, "metadata.annotations[vramfit.io/gpu-models]"),
    (None, [ctr("1.5")], "spec.containers[0].resources.requests[vramfit.io/vram]"),
    (None, [ctr("500Ki")], "spec.containers[0].resources.requests[vramfit.io/vram]"),
    (None, [ctr("1e25")], "spec.containers[0].resources.requests[vramfit.io/vram]"),
    (None, [ctr("0", section="limits")], "spec.containers[0].resources.limits[vramfit.io/vram]"),
    (None, [ctr(1e25)], "spec.containers[0].resources.requests[vramfit.io/vram]"),
    ({"vramfit.io/vram": "1e25"}, None, "metadata.annotations[vramfit.io/vram]"),
    ({"vramfit.io/vram": "15032385536"}, None, "metadata.annotations[vramfit.io/vram]"),  # bytes, unit forgotten
    (None, [ctr("10Ti"), ctr("10Ti")], "spec.containers[*].resources[vramfit.io/vram]"),  # 20 TiB in all
])
def test_malformed_values_name_pod_and_field(annotations, containers, field) -> None:
    p = pod(containers=containers, annotations=annotations, name="bad")
    with pytest.raises(InputError) as err:
        pod_demand(p)
    assert err.value.obj == "pod team-a/bad" and err.value.field_name == field
    assert "team-a/bad" in str(err.value)


# ---- the one VRAM unit rule: a bare number is MiB, a quantity with a unit is bytes ------------------------


@pytest.mark.parametrize(("value", "mib"), [
    ("14336", 14336), (14336, 14336), (14336.0, 14336), ("16e3", 16000), ("1", 1),
    ("14Gi", 14336), ("14336Mi", 14336), ("14G", 13352), ("500Mi", 500), ("1.5Gi", 1536), ("1Mi", 1),
    ("1025Ki", 2),  # rounded up: a pod asking a little more than 1 MiB needs 2
    ("16k", 16000), ("1.5k", 1500),  # the API server's canonical form of a bare 16000 / 1500 is 16k / 1500
    ("16Ti", MAX_VRAM_MIB), (str(MAX_VRAM_MIB), MAX_VRAM_MIB),
])
def test_vram_unit_rule(value, mib) -> None:
    assert vram_to_mib(value) == mib


@pytest.mark.parametrize(("value", "says"), [
    ("0", "at least 1 MiB"), ("-1", "at least 1 MiB"), ("1.5", "whole MiB"), (0.5, "whole MiB"),
    ("500Ki", "less than 1 MiB"), ("500m", "less than 1 MiB"), ("1048575", None),
    ("15032385536", "more than 16 TiB"), ("1e25", "more than 16 TiB"), (1e25, "more than 16 TiB"),
    (10**40, "more than 16 TiB"), ("1e30Gi", "quantity"), ("17Ti", "more than 16 TiB"),
    (str(MAX_VRAM_MIB + 1), "more than 16 TiB"), ("1E", "more than 16 TiB"),
    (float("inf"), "finite"), (float("nan"), "finite"), (True, "quantity"), (None, "quantity"),
    ("9" * 5000, "quantity"), ("14GB", "quantity"), ("lots", "quantity"),
])
def test_vram_out_of_range_or_malformed_is_a_value_error(value, says) -> None:
    if says is None:  # a bare 1048575 is 1048575 MiB (~1 TiB), not bytes
        assert vram_to_mib(value) == 1048575
        return
    with pytest.raises(ValueError, match=says):
        vram_to_mib(value)


@pytest.mark.parametrize("value", ["14336", "14Gi", "14G", "16k", "1.5Gi", "1e25", "500Ki", "abc", "0"])
def test_annotation_and_resource_follow_the_same_rule(value) -> None:
    def read(p: dict) -> int | str:
        try:
            d = pod_demand(p)
        except InputError as err:
            return err.problem
        assert d is not None
        return d.vram_mib

    assert read(pod(annotations={"vramfit.io/vram": value})) == read(pod(containers=[ctr(value)]))


@given(st.integers(1, MAX_VRAM_MIB))
def test_vram_mib_forms_agree(n) -> None:
    assert vram_to_mib(str(n)) == vram_to_mib(f"{n}e0") == vram_to_mib(f"{n}Mi") == n
    if n % 1000 == 0:  # what the API server hands back for a bare multiple of 1000 reads the same
        assert vram_to_mib(f"{n // 1000}k") == n
    if n >= 1024:  # n KiB is bytes: rounded up to whole MiB
        assert vram_to_mib(f"{n}Ki") == -(-n // 1024)


def test_old_annotation_rule_is_gone() -> None:
    # A bare number in the annotation used to be bytes (14336 bytes -> 1 MiB); it is MiB, as in resources.
    d = pod_demand(pod(annotations={"vramfit.io/vram": "14336"}))
    assert d is not None and d.vram_mib == 14336
    # A unit in resources used to be a count (14Gi -> 15032385536 "MiB"); it is bytes, as in the annotation.
    d = pod_demand(pod(containers=[ctr("14Gi"), ctr("2Gi", section="limits")]))
    assert d is not None and d.vram_mib == 16384


def test_holdings_from_assignment_and_from_nvidia_resources() -> None:
    bound = pod(containers=[ctr("30720")], annotations={"vramfit.io/assignment": json.dumps(
        {"gpus": [{"index": 1, "mig": "3g.40gb@4", "vram_mib": 30720}]})})
    bound["spec"]["nodeName"] = "n1"
    h = pod_holding(bound)
    assert h is not None and h.grants is not None and h.grants[0].mig == "3g.40gb@4"
    foreign = pod(containers=[{"name": "c", "resources": {"limits": {"nvidia.com/mig-1g.10gb": "2",
                                                                    "nvidia.com/gpu": "1"}}}])
    h = pod_holding(foreign)
    assert h is not None and h.mig_profiles == ("1g.10gb", "1g.10gb") and h.whole_gpus == 1
    broken = pod(containers=[ctr("100")], annotations={"vramfit.io/assignment": "{not json"})
    with pytest.raises(InputError, match="vramfit.io/assignment"):
        pod_holding(broken)
