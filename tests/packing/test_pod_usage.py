"""The `vramfit.io/pod-usage` annotation: read back exactly what was written, bad input named, capped in size."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packing.k8s.pod_usage import (
    ANN_POD_USAGE,
    NodeUsageReport,
    PodUsage,
    UnmappedProcess,
    node_usage_reports,
    parse_pod_usage,
    read_pod_usage,
    usage_annotation,
)
from packing.model import InputError


def _node(text: str | None, name: str = "gpu-1") -> dict[str, Any]:
    ann = {} if text is None else {ANN_POD_USAGE: text}
    return {"metadata": {"name": name, "annotations": ann}}


def _usage(pod: str = "chat-0", used: int | None = 3 << 30, booked: int | None = 4 << 30,
           unit: str = "timeslice", container: str = "main") -> PodUsage:
    return PodUsage(namespace="team-a", pod=pod, uid=f"uid-{pod}", container=container, gpu_uuid="GPU-1",
                    unit=unit, used_bytes=used, peak_bytes=used, booked_bytes=booked,
                    over=used is not None and booked is not None and used > booked)


def test_the_contract_example_reads() -> None:
    text = json.dumps({
        "sampled_at": "2026-12-06T07:00:00Z", "period_s": 5,
        "pods": [{"namespace": "team-a", "pod": "chat-0", "uid": "u1", "container": "main", "gpu_uuid": "GPU-a",
                  "unit": "mig:3g.40gb@0", "used_bytes": 123, "peak_bytes": 456, "booked_bytes": 789,
                  "over": False}],
        "unmapped": [{"pid": 1234, "gpu_uuid": "GPU-a", "used_bytes": 55, "why": "no pod cgroup"}]})
    report = read_pod_usage(_node(text))
    assert report is not None
    assert report.period_s == 5
    assert report.pods[0].unit == "mig:3g.40gb@0"
    assert report.pods[0].peak_bytes == 456
    assert report.unmapped == (UnmappedProcess(pid=1234, gpu_uuid="GPU-a", used_bytes=55, why="no pod cgroup"),)
    assert not report.truncated
    assert report.for_pod("team-a", "chat-0") == report.pods


def test_a_node_without_the_annotation_has_no_report() -> None:
    assert read_pod_usage(_node(None)) is None
    assert read_pod_usage({"metadata": {"name": "n"}}) is None


_reports = st.builds(
    NodeUsageReport,
    sampled_at=st.just("2026-12-06T07:00:00Z"),
    period_s=st.sampled_from([1.0, 5.0, 15.0]),
    pods=st.lists(st.builds(
        PodUsage, namespace=st.sampled_from(["a", "b"]), pod=st.text("abc-0123", min_size=1, max_size=8),
        uid=st.text("0123456789abcdef", max_size=8), container=st.sampled_from(["main", "side"]),
        gpu_uuid=st.sampled_from(["GPU-1", "GPU-2"]), unit=st.sampled_from(["gpu", "mps", "timeslice", "mig:1g.10gb@3"]),
        used_bytes=st.none() | st.integers(0, 1 << 40), peak_bytes=st.none() | st.integers(0, 1 << 40),
        booked_bytes=st.none() | st.integers(0, 1 << 40), over=st.booleans()), max_size=12).map(tuple),
    unmapped=st.lists(st.builds(UnmappedProcess, pid=st.integers(0, 1 << 22), gpu_uuid=st.just("GPU-1"),
                                used_bytes=st.none() | st.integers(0, 1 << 40), why=st.just("no pod cgroup")),
                      max_size=4).map(tuple),
    truncated=st.booleans())


@given(_reports)
def test_what_is_written_reads_back_the_same(report: NodeUsageReport) -> None:
    assert read_pod_usage(_node(usage_annotation(report))) == report


@settings(max_examples=40)
@given(_reports, st.integers(200, 3000))
def test_the_cap_holds_and_says_so(report: NodeUsageReport, cap: int) -> None:
    text = usage_annotation(report, cap=cap)
    back = parse_pod_usage(text, "node n")
    if len(usage_annotation(report).encode()) <= cap:
        assert back == report
        return
    assert len(text.encode()) <= cap or (not back.pods and not back.unmapped)
    assert back.truncated
    assert set(back.pods) <= set(report.pods)
    kept = {u.key for u in back.pods}
    # whole pods leave, never part of one
    assert all(u in back.pods for u in report.pods if u.key in kept)


def test_the_pod_with_most_entries_leaves_first() -> None:
    big = tuple(_usage("wide", container=f"c{i}") for i in range(6))
    small = (_usage("narrow"),)
    report = NodeUsageReport(sampled_at="2026-12-06T07:00:00Z", period_s=5, pods=big + small)
    full = len(usage_annotation(report).encode())
    text = usage_annotation(report, cap=full - 10)
    back = parse_pod_usage(text, "node n")
    assert back.truncated
    assert [u.pod for u in back.pods] == ["narrow"]


def test_the_default_cap_is_256_kib() -> None:
    pods = tuple(_usage(f"p{i}") for i in range(4000))
    text = usage_annotation(NodeUsageReport(sampled_at="2026-12-06T07:00:00Z", period_s=5, pods=pods))
    assert len(text.encode()) <= 256 * 1024
    back = parse_pod_usage(text, "node n")
    assert back.truncated and 0 < len(back.pods) < 4000


def test_unknown_use_stays_unknown() -> None:
    report = NodeUsageReport(sampled_at="2026-12-06T07:00:00Z", period_s=5, pods=(_usage(used=None),),
                             unmapped=(UnmappedProcess(7, "GPU-1", None, "no pod cgroup"),))
    text = usage_annotation(report)
    assert json.loads(text)["pods"][0]["used_bytes"] is None
    back = parse_pod_usage(text, "node n")
    assert back.pods[0].used_bytes is None and back.unmapped[0].used_bytes is None


_GOOD_POD = {"namespace": "a", "pod": "p", "uid": "u", "container": "c", "gpu_uuid": "G", "unit": "gpu",
             "used_bytes": 1, "peak_bytes": 1, "booked_bytes": 1, "over": False}


@pytest.mark.parametrize(("body", "field"), [
    ("{not json", r"metadata.annotations\[vramfit.io/pod-usage\]: not valid JSON"),
    ("[]", r"metadata.annotations\[vramfit.io/pod-usage\]: must be a JSON object"),
    ('{"sampled_at": "yesterday", "period_s": 5}', r"\.sampled_at: not an RFC 3339"),
    ('{"sampled_at": "2026-12-06T07:00:00", "period_s": 5}', r"\.sampled_at: needs a time zone"),
    ('{"sampled_at": "2026-12-06T07:00:00Z", "period_s": 0}', r"\.period_s: must be a positive"),
    ('{"sampled_at": "2026-12-06T07:00:00Z", "period_s": 5, "extra": 1}', r"\.extra: unknown field"),
    ('{"sampled_at": "2026-12-06T07:00:00Z", "period_s": 5, "pods": {}}', r"\.pods: must be a JSON list"),
    (json.dumps({"sampled_at": "2026-12-06T07:00:00Z", "period_s": 5, "pods": [{**_GOOD_POD, "unit": "vgpu"}]}),
     r"\.pods\[0\]\.unit: must be one of"),
    (json.dumps({"sampled_at": "2026-12-06T07:00:00Z", "period_s": 5, "pods": [{**_GOOD_POD, "used_bytes": -1}]}),
     r"\.pods\[0\]\.used_bytes: must be a non-negative integer"),
    (json.dumps({"sampled_at": "2026-12-06T07:00:00Z", "period_s": 5, "pods": [{**_GOOD_POD, "pod": ""}]}),
     r"\.pods\[0\]\.pod: must be a non-empty string"),
    (json.dumps({"sampled_at": "2026-12-06T07:00:00Z", "period_s": 5,
                 "unmapped": [{"pid": "x", "gpu_uuid": "G", "used_bytes": 1, "why": "w"}]}),
     r"\.unmapped\[0\]\.pid: must be a non-negative integer"),
])
def test_bad_input_names_the_node_and_the_field(body: str, field: str) -> None:
    with pytest.raises(InputError, match=r"^node gpu-7: field (metadata.annotations\[vramfit.io/pod-usage\])?" + field):
        read_pod_usage(_node(body, name="gpu-7"))


def test_a_node_that_is_not_an_object_is_refused() -> None:
    with pytest.raises(InputError, match="node: field metadata"):
        read_pod_usage({"metadata": None})


def test_the_reports_of_a_snapshot_are_its_named_nodes_and_each_bad_one_is_said() -> None:
    text = usage_annotation(NodeUsageReport(sampled_at="2026-12-06T07:00:00Z", period_s=5, pods=(_usage(),)))
    nameless = _node(text)
    nameless["metadata"].pop("name")
    objects = [{**_node(text, "b"), "kind": "Node"}, {**_node(text, "a"), "kind": "Pod"},
               {**_node("{", "bad"), "kind": "Node"}, {**nameless, "kind": "Node"},
               {**_node(None, "idle"), "kind": "Node"}, {**_node(text, "a"), "kind": "Node"}]
    said: list[InputError] = []
    got = list(node_usage_reports(objects, said.append))
    assert [name for name, _ in got] == ["b", "a"] and all(r.pods == (_usage(),) for _, r in got)
    assert [(e.obj, e.field_name) for e in said] == [
        ("node bad", f"metadata.annotations[{ANN_POD_USAGE}]"), ("node", "metadata.name")]
