"""The core registry ships the policies users choose from; the benchmark registers its research variants."""

from __future__ import annotations

import pytest

from benchmarks import peers, research_policies
from benchmarks.research_policies import FragAwareLab, FragDualLab
from packing.policies import core_policy_names, get_policy, policy_names, register


def test_the_core_ships_the_policies_users_choose_from() -> None:
    assert core_policy_names() == ["best-fit", "first-fit", "spread", "vramfit", "whole-gpu"]


def test_a_name_registers_once() -> None:
    """A second policy under a name would silently replace the first (an alias, or a peer shadowing the default)."""
    with pytest.raises(ValueError, match="'vramfit'"):
        register("vramfit", FragDualLab)
    research_policies.register()
    with pytest.raises(ValueError, match="'frag-dual'"):
        register("frag-dual", FragDualLab)


def test_registering_the_benchmarks_policies_twice_keeps_one_each() -> None:
    before = set(policy_names())
    for _ in range(2):
        peers.register()
        research_policies.register()
    assert set(research_policies.VARIANTS) | before <= set(policy_names())


def test_the_variants_take_their_research_parameters_and_the_default_does_not() -> None:
    research_policies.register()
    lab = get_policy("frag-dual", combine="gpu", lam=2.0, lp_mix="observed")
    assert isinstance(lab, FragDualLab) and (lab.combine, lab.lam, lab.lp_mix) == ("gpu", 2.0, "observed")
    assert isinstance(get_policy("frag-aware"), FragAwareLab)
    for param in ("combine", "lam", "lp_mix", "workload", "use_workload"):
        with pytest.raises(TypeError, match=param):
            get_policy("vramfit", **{param: None})
