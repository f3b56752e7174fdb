"""extender/v1 wire models: Go field names, Go's case-insensitive decoding, null members, int scores."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from extender import wire
from packing.cycle import scale_scores

FIXTURES = Path(__file__).parents[1] / "fixtures" / "k8s"


def test_filter_args_exact_payload_decodes() -> None:
    body = (FIXTURES / "filter-args-nodenames.json").read_bytes()
    args = wire.parse(wire.ExtenderArgs, body)
    assert args.Nodes is None
    assert args.NodeNames == ["gpu-h100-a", "gpu-a100-b", "cpu-only-1", "gpu-gone-7"]
    assert args.Pod["metadata"]["name"] == "llm-7b-inference"
    assert "kind" not in args.Pod  # API JSON from the informer cache carries no TypeMeta
    assert args.Pod["status"]["conditions"][0]["lastProbeTime"] is None


def test_nodelist_form_decodes() -> None:
    node = json.loads((FIXTURES / "node-a100-gfd.json").read_text())
    body = json.dumps({"Pod": {"metadata": {"name": "p"}}, "Nodes": {"metadata": {}, "items": [node]},
                       "NodeNames": None}).encode()
    args = wire.parse(wire.ExtenderArgs, body)
    assert args.NodeNames is None
    assert args.Nodes is not None and args.Nodes.items == [node]
    assert args.Nodes.items[0]["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"] == 10250


def _lower_keys(doc: Any, depth: int) -> Any:
    """Lower-case the Go-struct keys (depth levels down), not the nested API objects."""
    if depth == 0 or not isinstance(doc, dict):
        return doc
    return {k.lower(): _lower_keys(v, depth - 1) for k, v in doc.items()}


@pytest.mark.parametrize(("model", "doc"), [
    (wire.ExtenderBindingArgs, {"PodName": "p", "PodNamespace": "ns", "PodUID": "u-1", "Node": "n1"}),
    (wire.ExtenderFilterResult, {"Nodes": None, "NodeNames": ["a"], "FailedNodes": {"b": "full"},
                                 "FailedAndUnresolvableNodes": {"c": "never"}, "Error": ""}),
    (wire.HostPriority, {"Host": "a", "Score": 7}),
    (wire.ExtenderBindingResult, {"Error": "boom"}),
])
def test_lower_cased_documents_decode_to_the_same_value(model: type[wire.GoStruct], doc: dict[str, Any]) -> None:
    # extender/v1 types_test.go checks exactly this: a lower-cased copy decodes to the same value.
    exact = model.model_validate(doc)
    lowered = model.model_validate(_lower_keys(doc, 1))
    assert exact == lowered


def test_lower_cased_preemption_args_decode() -> None:
    doc = {"Pod": {"metadata": {"name": "p"}}, "NodeNameToVictims": None,
           "NodeNameToMetaVictims": {"n1": {"Pods": [{"UID": "v1"}], "NumPDBViolations": 1}}}
    lowered = {"pod": doc["Pod"], "nodenametovictims": None,
               "nodenametometavictims": {"n1": {"pods": [{"uid": "v1"}], "numpdbviolations": 1}}}
    assert wire.ExtenderPreemptionArgs.model_validate(doc) == wire.ExtenderPreemptionArgs.model_validate(lowered)


@given(st.lists(st.booleans(), min_size=len("NodeNames"), max_size=len("NodeNames")),
       st.lists(st.booleans(), min_size=3, max_size=3))
def test_any_casing_of_go_keys_is_accepted(node_case: list[bool], pod_case: list[bool]) -> None:
    def recase(word: str, flags: list[bool]) -> str:
        return "".join(c.upper() if f else c.lower() for c, f in zip(word, flags, strict=True))

    body = json.dumps({recase("Pod", pod_case): {"metadata": {"name": "x"}},
                       recase("NodeNames", node_case): ["n1", "n2"]}).encode()
    args = wire.parse(wire.ExtenderArgs, body)
    assert args.NodeNames == ["n1", "n2"]
    assert args.Pod == {"metadata": {"name": "x"}}


def test_duplicate_keys_last_one_wins_like_go() -> None:
    body = b'{"Pod": {"a": 1}, "NodeNames": ["x"], "pod": {"b": 2}, "nodenames": ["y"]}'
    args = wire.parse(wire.ExtenderArgs, body)
    assert args.Pod == {"b": 2}
    assert args.NodeNames == ["y"]


def test_unknown_keys_are_ignored() -> None:
    args = wire.parse(wire.ExtenderArgs, b'{"Pod": {}, "NodeNames": [], "Future": 1}')
    assert args.NodeNames == []


@pytest.mark.parametrize(("body", "fragment"), [
    (b"", "empty request body"),
    (b"\x00\xff\x13binary", "not UTF-8"),
    (b"{not json", "malformed JSON at line 1"),
    (b"[1, 2]", "expected a JSON object"),
    (b'{"NodeNames": ["a"]}', "Pod: Field required"),
    (b'{"Pod": null, "NodeNames": ["a"]}', "Pod"),
    (b'{"Pod": {}, "NodeNames": "a"}', "NodeNames"),
    (b'{"Pod": {}, "NodeNames": [1]}', "NodeNames.0"),
    (b"[" * 100_000, "malformed JSON"),
])
def test_bad_requests_name_the_problem(body: bytes, fragment: str) -> None:
    with pytest.raises(wire.WireError) as exc:
        wire.parse(wire.ExtenderArgs, body)
    assert fragment in str(exc.value)


def test_binding_args_require_strings() -> None:
    with pytest.raises(wire.WireError, match="PodUID"):
        wire.parse(wire.ExtenderBindingArgs, b'{"PodName": "p", "PodNamespace": "ns", "PodUID": 5, "Node": "n"}')


def test_go_int64_rejects_floats() -> None:
    with pytest.raises(wire.WireError, match="NumPDBViolations"):
        wire.parse(wire.ExtenderPreemptionArgs,
                   b'{"Pod": {}, "NodeNameToMetaVictims": {"n": {"Pods": [], "NumPDBViolations": 1.5}}}')


def test_filter_result_encoding_has_every_go_key() -> None:
    out = wire.filter_result(node_names=["a"], failed={"b": "full now"}, unresolvable={"c": "never"})
    text = json.dumps(out)
    assert list(out) == ["Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"]
    assert '"Nodes": null' in text
    assert wire.ExtenderFilterResult.model_validate(out).NodeNames == ["a"]


def test_filter_result_nodes_form() -> None:
    out = wire.filter_result(nodes=[{"metadata": {"name": "a"}}])
    assert out["NodeNames"] is None
    assert out["Nodes"] == {"metadata": {}, "items": [{"metadata": {"name": "a"}}]}


@given(st.lists(st.tuples(st.text(min_size=1, max_size=8), st.integers(0, 10)), max_size=20))
def test_host_priorities_are_a_bare_array_of_int_scores(pairs: list[tuple[str, int]]) -> None:
    text = json.dumps(wire.host_priorities([(h, float(s)) for h, s in pairs]))  # type: ignore[misc]
    decoded = json.loads(text)
    assert isinstance(decoded, list)
    for item, (host, score) in zip(decoded, pairs, strict=True):
        assert list(item) == ["Host", "Score"]
        assert item["Host"] == host and item["Score"] == score and isinstance(item["Score"], int)
        wire.HostPriority.model_validate(item)


@given(st.lists(st.tuples(st.text(max_size=8), st.integers(0, 10)), max_size=20))
def test_encoded_host_priorities_match_the_dict_encoding(pairs: list[tuple[str, int]]) -> None:
    """The hot path's pre-encoded answer is byte for byte the plain encoding (quotes, escapes, unicode)."""
    prefixes = np.array([wire.host_prefix(h) for h, _ in pairs], dtype=object)
    scores = np.array([s for _, s in pairs], dtype=np.int64)
    fast = wire.host_priorities_json(prefixes, scores)
    assert fast == wire.dumps(wire.host_priorities(pairs))
    assert json.loads(fast) == [{"Host": h, "Score": s} for h, s in pairs]


def test_preemption_result_is_meta_form() -> None:
    out = wire.preemption_result({"n1": (["u1", "u2"], 1)})
    assert out == {"NodeNameToMetaVictims": {"n1": {"Pods": [{"UID": "u1"}, {"UID": "u2"}], "NumPDBViolations": 1}}}
    assert wire.ExtenderPreemptionResult.model_validate(out).NodeNameToMetaVictims is not None


def test_binding_args_key_order_matches_go() -> None:
    args = wire.ExtenderBindingArgs(PodName="p", PodNamespace="ns", PodUID="u", Node="n")
    assert list(args.model_dump()) == ["PodName", "PodNamespace", "PodUID", "Node"]


# ---- prioritize's score mapping ------------------------------------------------------------------------

@given(arrays(np.float64, st.integers(1, 40), elements=st.floats(-1e12, 1e12)), st.data())
def test_scale_scores_keeps_order_and_range(scores: np.ndarray, data: st.DataObject) -> None:
    n = scores.shape[0]
    feasible = np.array(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)))
    idx = np.array(data.draw(st.lists(st.integers(-1, n - 1), min_size=1, max_size=2 * n)), dtype=np.int64)
    out = scale_scores(scores, feasible, idx).tolist()
    assert len(out) == len(idx) and all(isinstance(v, int) and 0 <= v <= 10 for v in out)
    ok = [i >= 0 and bool(feasible[i]) for i in idx]
    assert all(v == 0 for v, good in zip(out, ok, strict=True) if not good)
    vals = [(scores[i], v) for i, v, good in zip(idx, out, ok, strict=True) if good]
    if vals:
        best = max(s for s, _ in vals)
        assert all((v == 10) == (s == best) for s, v in vals)  # the policy's pick, and only it, gets 10
        for s1, v1 in vals:  # never inverts the policy's order
            for s2, v2 in vals:
                if s1 > s2:
                    assert v1 >= v2
