"""packing.preemption: the victim rule the extender's preempt verb answers with, on the core alone."""

from __future__ import annotations

from packing import fit
from packing.model import Gpu, Mode, Node, PodDemand
from packing.preemption import fewest_victims
from packing.state import ClusterState


def _cluster(*holders: PodDemand) -> ClusterState:
    gpus = tuple(Gpu(i, 81559, Mode.EXCLUSIVE, "NVIDIA-H100-80GB-HBM3", "H100-80GB") for i in range(2))
    state = ClusterState([Node("n0", gpus)])
    for p in holders:
        asg = fit.choose_units(state, "n0", p, False)
        assert asg is not None
        state.allocate(p, asg)
    return state


LOW = PodDemand("ns/low", 40000, uid="u-low", priority=0)
HIGH = PodDemand("ns/high", 40000, uid="u-high", priority=5)


def test_the_lowest_priority_holder_goes_and_victims_without_gpus_stay_the_schedulers() -> None:
    state = _cluster(LOW, HIGH)
    before = {k: h.assignment for k, h in state._holders.items()}
    pod = PodDemand("ns/new", 30000, uid="u-new", priority=10)
    assert fewest_victims(state, "n0", pod, ["u-high", "u-cpu-only", "u-low"], False) == ["u-cpu-only", "u-low"]
    assert {k: h.assignment for k, h in state._holders.items()} == before  # simulated on a copy


def test_a_pod_that_needs_every_gpu_takes_every_holder() -> None:
    state = _cluster(LOW, HIGH)
    pod = PodDemand("ns/big", 40000, gpu_count=2, uid="u-big", priority=10)
    assert fewest_victims(state, "n0", pod, ["u-low", "u-high"], False) == ["u-low", "u-high"]


def test_no_set_of_victims_makes_room_or_the_node_is_unknown() -> None:
    state = _cluster(LOW, HIGH)
    pod = PodDemand("ns/big", 40000, gpu_count=2, uid="u-big", priority=10)
    assert fewest_victims(state, "n0", pod, ["u-low"], False) is None
    assert fewest_victims(state, "elsewhere", pod, ["u-low"], False) is None


def test_a_pod_that_fits_already_evicts_no_gpu_holder_but_for_the_schedulers_own_reasons() -> None:
    state = _cluster(LOW)
    pod = PodDemand("ns/new", 30000, uid="u-new")
    assert fewest_victims(state, "n0", pod, ["u-low", "u-x"], False) == ["u-x"]
    assert fewest_victims(state, "n0", pod, ["u-low"], False) == ["u-low"]  # all GPU-side: the scheduler's set
