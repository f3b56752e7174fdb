"""The extender under hostile and broken input: no 5xx, nothing learnt from a rejected pod, bounded memory and
time per request, and bind only for pods the scheduler is binding.

A fuzz test drives all four verbs over real HTTP (uvicorn, the app's own protocol options) with random JSON
trees, mutated valid requests, weird unicode, huge numbers and deep nesting; the store's placement rules and
the process's memory are checked afterwards."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.local_server import LocalServer
from extender import wire
from extender.app import create_app, uvicorn_options
from extender.binder import MemoryBinder
from extender.config import Settings
from extender.service import Extender
from extender.store import Store
from packing import fit
from packing.model import PodDemand
from packing.policies.frag_aware import FragAware
from packing.policies.mix import PodShape
from tests.extender.test_extender_app import CATALOG, PREFIX, Served, exclusive, node, pod, strip_kind
from tests.packing.test_core_invariants import assert_invariants

H100 = "NVIDIA-H100-80GB-HBM3"
MIXED = [
    {"index": 0, "product": "NVIDIA-A100-SXM4-80GB", "mode": "exclusive"},
    {"index": 1, "product": H100, "mode": "mig",
     "mig": [{"profile": "1g.10gb", "start": 0}, {"profile": "1g.10gb", "start": 1},
             {"profile": "2g.20gb", "start": 2}, {"profile": "3g.40gb", "start": 4}]},
    {"index": 2, "product": H100, "mode": "mps", "replicas": 4},
    {"index": 3, "product": "NVIDIA-L40S", "mode": "timeslice", "replicas": 4},
]
NAMES = ["n1", "n2", "n3"]


def cluster() -> list[dict[str, Any]]:
    return [node("n1", MIXED), node("n2", MIXED), node("n3", exclusive(8))]


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


def metric(served: Served, name: str, **labels: str) -> float:
    return float(served.app.state.services.metrics.registry.get_sample_value(name, labels) or 0.0)


def ext(served: Served) -> Extender:
    extender: Extender = served.app.state.services.extender
    return extender


def binding(p: dict[str, Any], node_name: str) -> dict[str, str]:
    meta = p["metadata"]
    return {"PodName": meta["name"], "PodNamespace": meta["namespace"], "PodUID": meta["uid"], "Node": node_name}


@pytest.fixture
def served() -> Iterator[Served]:
    s = Served(cluster())
    yield s
    s.close()


# ---- fuzz: every verb, every kind of bad input ------------------------------------------------------------

WEIRD_TEXT = st.text(alphabet=st.characters(codec=None, exclude_categories=("Cs",)), max_size=12) | st.sampled_from(
    ["", "\x00", "\u202e", "\ufeff", "💥" * 3, "a" * 300, "default", "metadata", "uid-1", "n1", "NaN"])
JSON_SCALARS = (st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False, allow_infinity=False)
                | WEIRD_TEXT)
JSON_TREES = st.recursive(JSON_SCALARS, lambda kids: st.lists(kids, max_size=4)
                          | st.dictionaries(WEIRD_TEXT, kids, max_size=4), max_leaves=20)
VRAMS = st.sampled_from(["1024", "8192", "14Gi", "80Gi", "1e25", "1e30", "16777216", "0", "-5", "1.5", 8192, "abc",
                         "999999999999999999999999"])


@st.composite
def pod_objects(draw: st.DrawFn, j: int) -> dict[str, Any]:
    p = pod(f"f{j}", 1024, uid=f"uid-f{j}", tenant=draw(st.sampled_from([None, "t1", "t2"])),
            gpus=draw(st.sampled_from([1, 1, 2, 9, 64])),
            annotations=draw(st.sampled_from([{}, {"vramfit.io/isolation": "hardware"},
                                              {"vramfit.io/isolation": "process"}, {"vramfit.io/isolation": "bogus"},
                                              {"vramfit.io/gpu-models": "a100"}])))
    res = p["spec"]["containers"][0]["resources"]
    res["requests"]["vramfit.io/vram"] = res["limits"]["vramfit.io/vram"] = draw(VRAMS)
    res["requests"]["cpu"] = draw(st.sampled_from(["1", "500m", "1e25", "100000", "x"]))
    if draw(st.booleans()):
        p["spec"]["schedulerName"] = draw(st.sampled_from(["vramfit-scheduler", "default-scheduler"]))
    return strip_kind(p)


@st.composite
def mutated(draw: st.DrawFn, doc: Any) -> Any:
    """A copy of `doc` with a few values replaced by random trees, keys dropped or re-cased."""
    doc = json.loads(json.dumps(doc))
    for _ in range(draw(st.integers(0, 3))):
        path: list[Any] = []
        cur = doc
        while isinstance(cur, (dict, list)) and cur and draw(st.booleans()):
            key = draw(st.sampled_from(sorted(cur) if isinstance(cur, dict) else list(range(len(cur)))))
            path.append(key)
            cur = cur[key]
        if not path:
            continue
        parent = doc
        for key in path[:-1]:
            parent = parent[key]
        action = draw(st.sampled_from(["replace", "drop", "case"]))
        if action == "replace":
            parent[path[-1]] = draw(JSON_TREES)
        elif action == "drop" and isinstance(parent, dict):
            del parent[path[-1]]
        elif action == "case" and isinstance(parent, dict) and isinstance(path[-1], str):
            parent[path[-1].swapcase()] = parent.pop(path[-1])
    return doc


def deep(depth: int) -> bytes:
    return b'{"Pod": {"a": ' + b"[" * depth + b"]" * depth + b'}, "NodeNames": ["n1"]}'


RAW_BODIES = st.sampled_from([
    b'{"Pod": {"metadata": {"name": "\\ud800"}}, "NodeNames": ["n1"]}',
    b'{"Pod": {"metadata": {"name": "a"}}, "NodeNames": ["\\udfff"]}',
    b'{"Pod": {"spec": {"priority": 123456789012345678901234567890}}, "NodeNames": ["n1"]}',
    b'{"Pod": {"spec": {"priority": NaN}}, "NodeNames": ["n1"]}',
    b'{"Pod": {"spec": {"priority": -Infinity}}, "NodeNames": ["n1"]}',
    b'{"Pod": {"metadata": "x"}, "NodeNames": ["n1"]}',
    b'{"Pod": {"metadata": {"name": "p"}}, "Nodes": {"items": [{"metadata": "x"}]}, "NodeNames": null}',
    b'{"Pod": {}, "NodeNameToVictims": {"n1": {"Pods": [{"metadata": "x"}, {"metadata": {"uid": 5}}]}}}',
    b'{"PodName": "p", "PodNamespace": "default", "PodUID": "\\ud800", "Node": "n1"}',
    b'{"a": 1, "a": 2}', b"\xef\xbb\xbf{}", b"\xff\xfe", b"[]", b"null", b"{", b"",
    deep(63), deep(64), deep(300), deep(1100),
])


@st.composite
def requests_(draw: st.DrawFn) -> list[tuple[str, bytes]]:
    out: list[tuple[str, bytes]] = []
    for j in range(draw(st.integers(1, 6))):
        verb = draw(st.sampled_from(["filter", "prioritize", "bind", "preempt"]))
        p = draw(pod_objects(j))
        valid: dict[str, Any] = {
            "filter": {"Pod": p, "Nodes": None, "NodeNames": NAMES + ["ghost"]},
            "prioritize": {"Pod": p, "Nodes": None, "NodeNames": NAMES},
            "bind": binding(p, draw(st.sampled_from(NAMES + ["ghost"]))),
            "preempt": {"Pod": p, "NodeNameToVictims": None,
                        "NodeNameToMetaVictims": {"n1": {"Pods": [{"UID": "uid-f0"}], "NumPDBViolations": 0}}},
        }[verb]
        kind = draw(st.sampled_from(["valid", "valid", "mutated", "tree", "raw"]))
        if kind == "raw":
            body = draw(RAW_BODIES)
        else:
            doc = valid if kind == "valid" else draw(mutated(valid)) if kind == "mutated" else draw(JSON_TREES)
            body = json.dumps(doc).encode()  # the stdlib writes what orjson refuses: big ints, lone surrogates
        if verb == "bind" and kind == "valid" and draw(st.booleans()):  # a real cycle: filter first
            out.append(("filter", json.dumps({"Pod": p, "Nodes": None, "NodeNames": NAMES}).encode()))
        out.append((verb, body))
    return out


@pytest.fixture(scope="module")
def fuzz_target() -> Iterator[tuple[Served, httpx.Client]]:
    store = Store.from_objects(cluster(), CATALOG)
    app = create_app(Settings(url_prefix=PREFIX), store, MemoryBinder())
    with LocalServer(app, **uvicorn_options()) as server, httpx.Client(base_url=server.url, timeout=30) as client:
        holder = Served.__new__(Served)
        holder.store, holder.app = store, app
        yield holder, client


def test_fuzz_every_verb_answers_without_5xx_and_keeps_the_rules(fuzz_target: tuple[Served, httpx.Client]) -> None:
    served, client = fuzz_target
    before = rss_mib()
    seen: dict[int, int] = {}

    @given(requests_())
    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
    def run(calls: list[tuple[str, bytes]]) -> None:
        for verb, body in calls:
            r = client.post(f"{PREFIX}/{verb}", content=body, headers={"Content-Type": "application/json"})
            seen[r.status_code] = seen.get(r.status_code, 0) + 1
            assert r.status_code < 500, (verb, body[:300], r.text[:300])
            answer = r.json()
            if r.status_code != 200:
                assert answer["Error"], (verb, body[:300])
            elif verb == "prioritize":
                assert all(0 <= h["Score"] <= 10 for h in answer)

    run()
    assert_invariants(served.store.state)
    assert seen.get(200) and seen.get(400)  # both kinds were exercised
    assert metric(served, "vramfit_requests_total", verb="filter", code="500") == 0
    assert rss_mib() - before < 300


# ---- the JSON layer: 400 with a reason where it cannot round-trip ---------------------------------------


@pytest.mark.parametrize(("verb", "body", "fragment"), [
    ("filter", b'{"Pod": {"metadata": {"name": "\\ud800"}}, "NodeNames": ["n1"]}', "surrogate"),
    ("filter", b'{"Pod": {"spec": {"priority": 123456789012345678901234567890}}, "NodeNames": []}', "64-bit"),
    ("filter", b'{"Pod": {"spec": {"priority": NaN}}, "NodeNames": ["n1"]}', "NaN"),
    ("filter", deep(300), "nested deeper than 64"),
    ("preempt", b'{"Pod": {"a": ' + b"[" * 100 + b"]" * 100 + b"}}", "nested deeper than 64"),
    ("bind", b'{"PodName": "p", "PodNamespace": "d", "PodUID": "\\udc00", "Node": "n1"}', "surrogate"),
])
def test_what_json_cannot_round_trip_is_400(served: Served, verb: str, body: bytes, fragment: str) -> None:
    r = served.post(verb, body)
    assert r.status_code == 400 and fragment in r.json()["Error"], r.text


def test_wrong_types_inside_objects_are_answered(served: Served) -> None:
    r = served.post("filter", b'{"Pod": {"metadata": "x"}, "NodeNames": ["n1"]}')
    assert r.status_code == 200 and "metadata" in r.json()["FailedAndUnresolvableNodes"]["n1"]
    r = served.post("filter", b'{"Pod": {}, "Nodes": {"items": [{"metadata": "x"}]}, "NodeNames": null}')
    assert r.status_code == 400 and "metadata.name" in r.json()["Error"]
    r = served.post("preempt", b'{"Pod": {}, "NodeNameToVictims": {"n1": {"Pods": [{"metadata": "x"}]}}}')
    assert r.status_code == 200


def test_prioritize_of_an_impossible_pod_is_neutral(served: Served) -> None:
    huge = pod("huge", 1024)
    huge["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "1e30"
    r = served.post("prioritize", {"Pod": strip_kind(huge), "NodeNames": NAMES})
    assert r.status_code == 200 and [h["Score"] for h in r.json()] == [0, 0, 0]


@pytest.mark.parametrize("objs", [[], [{**node("bad", []), "metadata": {
    "name": "bad", "uid": "u", "annotations": {"vramfit.io/gpus": "not json"}}}]])
def test_filter_with_no_usable_node_answers_reasons(objs: list[dict[str, Any]]) -> None:
    s = Served(objs)
    try:
        out = s.filter(pod("p", 1024), ["bad", "n1"])
        assert out["NodeNames"] == [] and set(out["FailedAndUnresolvableNodes"]) == {"bad", "n1"}
        r = s.post("prioritize", {"Pod": strip_kind(pod("p", 1024)), "NodeNames": ["bad", "n1"]})
        assert r.status_code == 200 and [h["Score"] for h in r.json()] == [0, 0]
    finally:
        s.close()


# ---- poisoning: a rejected shape never changes a later answer ------------------------------------------


def _bad_pods() -> dict[str, dict[str, Any]]:
    vram_1e25 = pod("bad", 1024, uid="uid-bad")
    for part in ("requests", "limits"):
        vram_1e25["spec"]["containers"][0]["resources"][part]["vramfit.io/vram"] = "1e25"
    cpu = pod("bad", 1024, uid="uid-bad")
    cpu["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "1e25"
    memory = pod("bad", 1024, uid="uid-bad")
    memory["spec"]["containers"][0]["resources"]["requests"]["memory"] = "1e25"
    return {"vram 1e25 MiB": vram_1e25, "cpu 1e25": cpu, "memory 1e25": memory,
            "more than any GPU": pod("bad", 4 * 2**20, uid="uid-bad"),
            "more GPUs than any node": pod("bad", 1024, uid="uid-bad", gpus=9),
            "a name the API cannot hold": pod("b" * 300, 1024, uid="uid-bad")}


def _cycle(s: Served, p: dict[str, Any]) -> tuple[Any, ...]:
    """One scheduling cycle as kube-scheduler runs it; its answers."""
    filtered = s.filter(p, NAMES)
    scores = s.post("prioritize", {"Pod": strip_kind(p), "NodeNames": filtered["NodeNames"]}).json()
    if not filtered["NodeNames"]:
        return filtered["NodeNames"], scores, None
    best = max(scores, key=lambda h: h["Score"])["Host"]
    return filtered["NodeNames"], scores, s.bind(p, best)


@pytest.mark.parametrize("bad", list(_bad_pods()))
def test_a_rejected_pod_never_changes_a_later_answer(bad: str) -> None:
    rng = np.random.default_rng(7)
    normal = [pod(f"p{j}", int(rng.choice([2048, 5000, 9000, 20000, 40000])), uid=f"uid-p{j}",
                  tenant=str(rng.choice(["t1", "t2"])), gpus=int(rng.choice([1, 1, 2])),
                  annotations={"vramfit.io/isolation": str(rng.choice(["none", "process", "hardware"]))})
              for j in range(70)]  # past the learnt mix's refreshes at 1, 2, 4, ... 64
    poisoned, fresh = Served(cluster()), Served(cluster())
    try:
        out = poisoned.filter(_bad_pods()[bad], NAMES)
        assert out["NodeNames"] == [] and len(out["FailedAndUnresolvableNodes"]) == len(NAMES)
        assert "pod cannot be placed by vramfit" in out["FailedAndUnresolvableNodes"]["n1"]
        r = poisoned.post("prioritize", {"Pod": strip_kind(_bad_pods()[bad]), "NodeNames": NAMES})
        assert r.status_code == 200
        assert "unknown to vramfit" in poisoned.bind(_bad_pods()[bad], "n3")["Error"]  # never remembered
        for p in normal:
            assert _cycle(poisoned, p) == _cycle(fresh, p), p["metadata"]["name"]
        policy = ext(poisoned).policy
        assert isinstance(policy, FragAware) and policy.current_mix() == ext(fresh).policy.current_mix()  # type: ignore[attr-defined]
        assert sorted(map(str, poisoned.store.state.holders())) == sorted(map(str, fresh.store.state.holders()))
        assert metric(poisoned, "vramfit_requests_total", verb="bind", code="500") == 0
    finally:
        poisoned.close()
        fresh.close()


def test_a_failing_policy_falls_back_to_best_fit(served: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    policy = ext(served).policy

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise OverflowError("Python int too large to convert to C long")

    monkeypatch.setattr(policy, "score", broken)
    monkeypatch.setattr(policy, "choose", broken)
    monkeypatch.setattr(policy, "observe", broken)
    p = pod("p", 8192, uid="uid-p")
    assert served.filter(p, NAMES)["NodeNames"] == NAMES
    r = served.post("prioritize", {"Pod": strip_kind(p), "NodeNames": NAMES})
    assert r.status_code == 200 and {h["Score"] for h in r.json()} == {10}  # neutral: every feasible node alike
    expected = fit.choose_units(served.store.state, "n3", served.store.demand_for("default", "p", "uid-p"), False)
    assert served.bind(p, "n3") == {"Error": ""}
    assert served.store.state.holder("default/p").assignment == expected
    for call in ("score", "choose", "observe"):
        assert metric(served, "vramfit_policy_errors_total", call=call) >= 1


# ---- learnt state stays bounded --------------------------------------------------------------------------


def _shape_pod(j: int, vram: int) -> PodDemand:
    return PodDemand(key=f"ns/p{j}", vram_mib=vram, uid=f"u{j}")


def test_learnt_shapes_are_capped_and_keep_the_popular_ones() -> None:
    policy = FragAware(max_shapes=64)
    for j in range(500):
        policy.observe(_shape_pod(j, 8192))
    for j in range(10_000):
        policy.observe(_shape_pod(j, 1000 + j))  # one-off shapes
    assert policy.learnt_shapes() <= 128
    mix = dict(policy.current_mix())
    assert PodShape(8192) in mix and mix[PodShape(8192)] == max(mix.values())


def test_the_cap_changes_nothing_below_it() -> None:
    capped, plain = FragAware(max_shapes=40), FragAware(max_shapes=10**9)
    rng = np.random.default_rng(3)
    for j in range(3000):
        p = _shape_pod(j, int(rng.choice(np.arange(1, 80)) * 1000))  # 79 shapes: under 2 x 40
        capped.observe(p)
        plain.observe(p)
    assert capped.current_mix() == plain.current_mix()


def test_unrepresentable_shapes_are_not_learnt() -> None:
    policy = FragAware()
    policy.observe(PodDemand(key="ns/p", vram_mib=1024, cpu_milli=10**28, uid="u"))
    policy.observe(PodDemand(key="ns/q", vram_mib=1024, uid="v"))
    assert [s for s, _ in policy.current_mix()] == [PodShape(1024)]


# ---- bounded cost per request ----------------------------------------------------------------------------


def _fat_pod(j: int, pad_bytes: int, **kwargs: Any) -> dict[str, Any]:
    p = pod(f"fat{j}", 1024, uid=f"uid-fat{j}", annotations={"pad": "x" * pad_bytes}, **kwargs)
    return strip_kind(p)


def test_demand_cache_has_a_byte_budget(served: Served) -> None:
    cache = ext(served).demands
    cache.max_bytes = 4 * 2**20
    for j in range(20):
        served.filter(_fat_pod(j, 2**20), ["n3"])
    assert cache.bytes <= cache.max_bytes and len(cache) <= 4
    # Keyed by UID + resourceVersion: the same object again is a hit, a new version a new entry.
    p = _fat_pod(99, 10)
    served.filter(p, ["n3"])
    n = len(cache)
    served.filter(p, ["n3"])
    assert len(cache) == n
    p["metadata"]["resourceVersion"] = "8"
    served.filter(p, ["n3"])
    assert len(cache) == min(n + 1, cache.max_entries)
    # Without a UID the JSON is hashed: still cached, still answered.
    anonymous = _fat_pod(100, 10)
    del anonymous["metadata"]["uid"]
    assert served.filter(anonymous, ["n3"])["NodeNames"] == ["n3"]
    assert served.filter(anonymous, ["n3"])["NodeNames"] == ["n3"]


def test_content_type_must_be_json(served: Served) -> None:
    body = json.dumps({"Pod": strip_kind(pod("p", 1024)), "NodeNames": NAMES})
    for verb in ("filter", "prioritize", "bind", "preempt"):
        r = served.client.post(f"{PREFIX}/{verb}", content=body, headers={"Content-Type": "text/plain"})
        assert r.status_code == 415 and "application/json" in r.json()["Error"]
    r = served.client.post(f"{PREFIX}/filter", content=body)  # none at all
    assert r.status_code == 415
    r = served.client.post(f"{PREFIX}/filter", content=body,
                           headers={"Content-Type": "Application/JSON; charset=utf-8"})
    assert r.status_code == 200


def _raw(port: int, data: bytes) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(data)
    return sock


def _read_all(sock: socket.socket) -> bytes:
    out = b""
    while chunk := sock.recv(65536):
        out += chunk
    return out


def test_a_body_that_trickles_in_gets_408(served: Served) -> None:
    served.app.state.services.body_timeout_s = 0.5
    head = (f"POST {PREFIX}/filter HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            "Content-Length: 1000\r\n\r\n").encode()
    sock = _raw(served.server.port, head + b'{"Pod": {')
    start = time.monotonic()
    answer = _read_all(sock)
    sock.close()
    assert answer.startswith(b"HTTP/1.1 408") and b"not received within 0.5 s" in answer
    assert time.monotonic() - start < 5
    assert served.filter(pod("p", 1024), ["n3"])["NodeNames"] == ["n3"]  # and the service keeps serving


@pytest.mark.parametrize("protocol", ["httptools", "h11"])
def test_a_slow_request_head_is_cut_off(protocol: str) -> None:
    app = create_app(Settings(url_prefix=PREFIX), Store.from_objects(cluster(), CATALOG), MemoryBinder())
    with LocalServer(app, **uvicorn_options(header_timeout_s=0.5, protocol=protocol)) as server:
        with httpx.Client(base_url=server.url) as client:  # a normal client is served, again and again
            for _ in range(3):
                assert client.get("/healthz").status_code == 200
            time.sleep(0.7)  # idle past the deadline (uvicorn's keep-alive closes idle ones at 5 s anyway)
            assert client.get("/healthz").status_code == 200
        sock = _raw(server.port, f"POST {PREFIX}/filter HTTP/1.1\r\nHost: x\r\n".encode())
        start = time.monotonic()
        assert _read_all(sock) == b""  # closed, never answered
        assert time.monotonic() - start < 5
        sock.close()
        # A head larger than the limit is refused at once (h11 and llhttp alike).
        sock = _raw(server.port, f"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Pad: {'a' * 40_000}".encode())
        assert _read_all(sock).startswith(b"HTTP/1.1 400")
        sock.close()


def test_a_large_call_is_answered_like_a_small_one(served: Served) -> None:
    names = NAMES + [f"node-{k:06d}" for k in range(20_000)]  # ~300 KiB: decoded off the event loop
    p = pod("p", 8192)
    big = served.filter(p, names)
    assert big["NodeNames"] == NAMES and len(big["FailedAndUnresolvableNodes"]) == 20_000


# ---- bind only what the scheduler is binding -------------------------------------------------------------


def test_bind_refuses_a_pod_no_filter_named(served: Served) -> None:
    out = served.bind(pod("p", 1024), "n3")
    assert "no filter call named it" in out["Error"]
    assert metric(served, "vramfit_binds_total", result="not_filtered") == 1
    assert served.store.state.holders() == [] and served.binder.bound == {}


def test_bind_refuses_after_the_filter_window(served: Served) -> None:
    now = [1000.0]
    ext(served).clock = lambda: now[0]
    p = pod("p", 1024)
    served.filter(p, ["n3"])
    now[0] += 301
    assert "no filter call named it in the last 300 s" in served.bind(p, "n3")["Error"]
    served.filter(p, ["n3"])  # the scheduler retries: filtered again
    assert served.bind(p, "n3") == {"Error": ""}


def test_bind_refuses_a_pod_for_another_scheduler(served: Served) -> None:
    p = pod("p", 1024)
    p["spec"]["schedulerName"] = "default-scheduler"
    served.filter(p, ["n3"])
    out = served.bind(p, "n3")
    assert "for scheduler 'default-scheduler'" in out["Error"]
    assert metric(served, "vramfit_binds_total", result="wrong_scheduler") == 1


def test_bind_refuses_a_pod_already_bound(served: Served) -> None:
    p = pod("p", 1024)
    served.filter(p, ["n3"])
    # The watch then shows it bound elsewhere (another scheduler, a node vramfit does not know).
    bound = pod("p", 1024, node_name="somewhere-else")
    served.store.apply("pods", "MODIFIED", strip_kind(bound))
    out = served.bind(p, "n3")
    assert "already bound to node somewhere-else" in out["Error"]
    assert metric(served, "vramfit_binds_total", result="already_bound") == 1
    assert served.binder.bound == {}


def test_a_retried_bind_still_succeeds(served: Served) -> None:
    p = pod("p", 1024)
    served.filter(p, ["n3"])
    assert served.bind(p, "n3") == {"Error": ""}
    assignment = served.binder.bound["uid-default-p"][2]
    # The watch delivers the pod bound (the Binding's work); the scheduler's retry after a timeout gets the
    # same answer, not "already bound".
    served.store.apply("pods", "MODIFIED", strip_kind(pod("p", 1024, node_name="n3",
                                                            assignment=assignment.to_annotation())))
    assert served.bind(p, "n3") == {"Error": ""}
    assert len(served.binder.bound) == 1


@given(st.dictionaries(WEIRD_TEXT, st.tuples(st.lists(WEIRD_TEXT, max_size=4), st.integers(0, 2**62)), max_size=5))
def test_preemption_answer_is_encoded_node_by_node_identically(victims: dict[str, tuple[list[str], int]]) -> None:
    assert wire.preemption_result_json(victims) == wire.dumps(wire.preemption_result(victims))
