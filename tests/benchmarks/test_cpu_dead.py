"""benchmarks/lab/cpu_dead.py: the free capacity's classes on a hand-built state."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.lab.cpu_dead import CLASSES, Shapes, classify
from packing import fit
from packing.model import Gpu, Mode, Node, PodDemand
from packing.state import ClusterState


def node(name: str, cpu: int) -> Node:
    gpus = tuple(Gpu(index=j, memory_mib=1000, mode=Mode.TIMESLICE, product="G2", model="G2", replicas=1000)
                 for j in range(2))
    return Node(name, gpus, cpu_milli=cpu, memory_mib=64000)


def test_classes_split_free_capacity_by_what_could_still_use_it() -> None:
    # Shapes: 500 milli with 8 CPUs, 100 milli with 1 CPU.
    shapes = Shapes(milli=np.array([500, 100]), cpu=np.array([8000, 1000]), mem=np.array([0, 0]))
    state = ClusterState([node("a", 16000), node("b", 8500)])
    for key, where, milli, cpu in [("p1", "a", 600, 4000), ("p2", "b", 500, 8000), ("p3", "b", 950, 0)]:
        pod = PodDemand(key=f"t/{key}", vram_mib=milli, tenant="t", cpu_milli=cpu)
        state.allocate(pod, fit.choose_units(state, where, pod) or pytest.fail("no fit"))
    got = classify(state, shapes)
    assert set(got) == set(CLASSES)
    # a: one idle GPU, 400 free beside p1 that a 100-milli pod (CPU left: 12) can use.
    # b: 500 free beside p2 with 0.5 CPU left (no shape fits: CPU-dead); 50 beside p3 (no shape that small).
    assert got == pytest.approx({"idle": 1.0, "fillable": 0.4, "cpu-dead": 0.5, "too-small": 0.05})
