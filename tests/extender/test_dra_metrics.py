"""DRA metrics in the extender's registry: a replica in DRA mode allocates one pod, keeps one it cannot place at the
gate, and /metrics says so; the gate-to-allocation histogram counts each latency once, in its `le` bucket."""

from __future__ import annotations

import bisect
from collections.abc import Callable

import httpx
from dra_builders import GPU_CLASS, ONE_GPU_SLICE, gated_pod
from dra_builders import claim as new_claim
from fakes.apiserver import FakeApiServer
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families
from waiting import wait_for

from benchmarks.local_server import LocalServer
from extender.config import Settings
from extender.dra.metrics import LATENCY_BUCKETS, LatencyHistogram
from extender.leader import LeaseConfig
from extender.replica import cluster_replica
from kubeio.client import api_client
from kubeio.reflector import Backoff
from packing.catalog import Catalog

FAMILIES = {"vramfit_dra_nodes": "gauge", "vramfit_dra_claims_allocated": "gauge", "vramfit_dra_pods_waiting": "gauge",
            "vramfit_dra_allocations": "counter", "vramfit_dra_allocation_failures": "counter",
            "vramfit_dra_gate_to_allocation_seconds": "histogram"}


def _scrape(c: httpx.Client) -> dict[str, float]:
    """/metrics with prometheus_client's parser: DRA sample name (with `le` for buckets) -> value."""
    r = c.get("/metrics")
    assert r.status_code == 200
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(r.text):
        if family.name in FAMILIES:
            assert family.type == FAMILIES[family.name], family.name
            for s in family.samples:
                out[s.name + (f"{{le={s.labels['le']}}}" if "le" in s.labels else "")] = s.value
    return out


def test_a_dra_replica_exports_nodes_claims_waiting_pods_counts_and_latency(
        catalog: Catalog, fake_api: Callable[..., FakeApiServer], fast_backoff: Callable[[], Backoff]) -> None:
    fake = fake_api(nodes=[])
    fake.add_slice(ONE_GPU_SLICE)
    fake.add_device_class(GPU_CLASS)
    lease = LeaseConfig(namespace="vramfit-system", identity="r1", lease_duration_s=1.5, renew_deadline_s=1.0,
                        retry_period_s=0.2)
    replica = cluster_replica(api_client(host=fake.url), Settings(dra=True), catalog, lease=lease,
                              backoff=fast_backoff).start()
    try:
        with LocalServer(replica.asgi) as server, httpx.Client(base_url=server.url, timeout=20) as c:
            wait_for(lambda: c.get("/readyz").status_code == 200, timeout_s=15)
            first = _scrape(c)
            assert set(first) >= {"vramfit_dra_nodes", "vramfit_dra_claims_allocated", "vramfit_dra_pods_waiting",
                                  "vramfit_dra_allocations_total", "vramfit_dra_allocation_failures_total",
                                  "vramfit_dra_gate_to_allocation_seconds_count",
                                  "vramfit_dra_gate_to_allocation_seconds_sum"}
            assert first["vramfit_dra_nodes"] == 1
            assert first["vramfit_dra_allocations_total"] == 0
            assert first["vramfit_dra_gate_to_allocation_seconds_count"] == 0
            fake.add_claim(new_claim("team-a", "whole"))
            fake.add_pod(gated_pod("team-a", "fits", claim="whole"))
            fake.add_claim(new_claim("team-a", "huge", memory="500Gi"))  # more memory than the one device has
            fake.add_pod(gated_pod("team-a", "too-big", claim="huge"))
            seen: list[dict[str, float]] = []

            def settled() -> bool:
                seen.append(_scrape(c))
                return (seen[-1]["vramfit_dra_pods_waiting"] == 1 and seen[-1]["vramfit_dra_claims_allocated"] == 1
                        and seen[-1]["vramfit_dra_allocations_total"] == 1)

            wait_for(settled, timeout_s=15, poll_s=0.05)
            now = seen[-1]
            again = _scrape(c)
    finally:
        replica.stop(release=True)
    assert now["vramfit_dra_allocations_total"] == 1 == replica.dra.allocated_total  # type: ignore[union-attr]
    assert now["vramfit_dra_allocation_failures_total"] >= 1
    assert now["vramfit_dra_gate_to_allocation_seconds_count"] == 1
    assert now["vramfit_dra_gate_to_allocation_seconds_bucket{le=+Inf}"] == 1
    assert now["vramfit_dra_gate_to_allocation_seconds_sum"] > 0
    buckets = [now[f"vramfit_dra_gate_to_allocation_seconds_bucket{{le={b}}}"] for b in LATENCY_BUCKETS]
    assert buckets == sorted(buckets)  # cumulative
    # A second scrape reads no sample twice.
    assert again["vramfit_dra_gate_to_allocation_seconds_count"] == 1
    assert again["vramfit_dra_gate_to_allocation_seconds_sum"] == now["vramfit_dra_gate_to_allocation_seconds_sum"]


def _buckets(h: LatencyHistogram) -> dict[str, float]:
    family = h.family("x_seconds", "x")
    return {s.labels["le"]: s.value for s in family.samples if s.name.endswith("_bucket")}


@given(st.lists(st.lists(st.floats(min_value=0.0, max_value=60.0), max_size=20), max_size=8))
def test_latency_histogram_read_in_scrapes_equals_the_whole_list_at_once(batches: list[list[float]]) -> None:
    samples: list[float] = []
    h = LatencyHistogram()
    for batch in batches:
        samples.extend(batch)  # the allocator appends between scrapes
        h.take(samples)
    everything = [s for b in batches for s in b]
    counts = _buckets(h)
    assert counts["+Inf"] == len(everything)
    for bound in LATENCY_BUCKETS:
        below = sorted(everything)
        assert counts[str(bound)] == bisect.bisect_right(below, bound)  # le: at most the bound
    assert abs(h.total - sum(everything)) <= 1e-6 * max(1.0, sum(everything))


def test_latency_histogram_bucket_edges_and_a_replaced_list() -> None:
    h = LatencyHistogram()
    h.take([0.05, 0.07, 10.0, 11.0])
    assert _buckets(h) == {"0.05": 1, "0.1": 2, "0.25": 2, "0.5": 2, "1.0": 2, "2.5": 2, "5.0": 2, "10.0": 3,
                           "+Inf": 4}
    h.take([0.2])  # shorter than what was read: a new list, all of it new
    assert _buckets(h)["0.25"] == 3 and _buckets(h)["+Inf"] == 5
