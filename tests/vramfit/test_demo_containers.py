"""The demo shows the whole chain: each placed pod's container environment is the node agent's answer."""

from __future__ import annotations

from packing.policies import DEFAULT_POLICY
from vramfit.demo import compare, format_comparison


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
