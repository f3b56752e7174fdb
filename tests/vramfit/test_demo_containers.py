"""The demo shows the whole chain: each placed pod's container environment is the node agent's answer."""

from __future__ import annotations

from benchmarks import research_policies
from packing.policies import DEFAULT_POLICY
from vramfit.demo import DEMO_CLUSTER, DEMO_PODS, compare, format_comparison
from vramfit.whatif import load_catalog_arg, load_cluster, load_pending, simulate


def test_every_placed_pod_shows_what_its_container_receives() -> None:
    runs = compare(DEFAULT_POLICY)
    placed = [p for p in runs[DEFAULT_POLICY]["placements"] if p["node"]]
    assert placed
    for p in placed:
        env = p["container"]["env"]
        units = env["NVIDIA_VISIBLE_DEVICES"].split(",")
        assert len(units) == len(p["gpus"]) == len(p["container"]["memory_limit"])
        for unit, g in zip(units, p["gpus"], strict=True):
            assert f"/gpu{g['index']}" in unit and (g["mig"] is None or g["mig"] in unit)
            assert p["node"] in unit
        if any("time-slicing" in limit for limit in p["container"]["memory_limit"]):
            assert env["VRAMFIT_VRAM_MIB"] == str(p["vram_mib"])
    text = format_comparison(runs)
    assert "CONTAINER RECEIVES" in text and placed[0]["pod"] in text.split("CONTAINER RECEIVES", 1)[1]


def test_gpus_outside_the_reference_size_are_weighed_by_the_measure() -> None:
    """On the demo's mixed fleet (MIG A100s, H100s under MPS, time-sliced T4s) the default's LP prices only the
    pooled GPUs of one size; the others have no dual cost and must not win for lack of one. The default then
    places every pod where the measure alone does (before that fix it moved them all onto MIG: 7 GPUs used,
    31 GiB more stranded)."""

    def placements(policy: str) -> list[tuple[str, object, list[object]]]:
        state, _ = load_cluster(str(DEMO_CLUSTER), load_catalog_arg(None))
        run = simulate(state, load_pending(str(DEMO_PODS)), policy)
        return [(p["pod"], p["node"], [(g["index"], g["mig"]) for g in p["gpus"] or []]) for p in run["placements"]]

    research_policies.register()  # vramfit-measure, the measure alone, is the benchmark's variant
    ours, measure = placements(DEFAULT_POLICY), placements("vramfit-measure")
    assert ours == measure
    assert any(node == "t4-timeslice" for _, node, _ in ours)
