"""benchmarks.variants: the generator's invariants (issue 14)."""

from __future__ import annotations

from collections import Counter

import pytest

from benchmarks.trace import DEFAULT_NODES_CSV, load_nodes
from benchmarks.variants import (
    CPU_FACTOR,
    HELD_OUT,
    SUITES,
    TUNING,
    default_tasks,
    kind,
    make_variant,
    multi_share,
)


@pytest.fixture(scope="module")
def base():
    return default_tasks()


@pytest.fixture(scope="module")
def nodes():
    return load_nodes(DEFAULT_NODES_CSV)


def _gpu(ts):
    return [t for t in ts if kind(t) != "cpu"]


@pytest.mark.parametrize("family,pct", [("gpushare", 60), ("multigpu", 30), ("gpuspec", 25), ("cpuheavy", 20)])
def test_deterministic_per_seed_and_pure(base, family, pct):
    before = list(base)
    a = make_variant(base, family, pct, 7)
    assert a == make_variant(base, family, pct, 7)
    assert a != make_variant(base, family, pct, 8)
    assert base == before  # input untouched
    assert len({t.name for t in a}) == len(a)  # names unique


@pytest.mark.parametrize("pct", [20, 40, 80, 100])
def test_gpushare_share_and_shape(base, pct):
    v = make_variant(base, "gpushare", pct, 1)
    assert len(v) == len(base)
    assert [t.name for t in v] == [t.name for t in base]
    assert [t for t in v if kind(t) == "cpu"] == [t for t in base if kind(t) == "cpu"]
    g = _gpu(v)
    assert len(g) == len(_gpu(base))
    assert sum(kind(t) == "share" for t in g) == round(pct / 100 * len(g))
    # every GPU task is a default task of its kind (resources drawn, name kept)
    pool = {(t.cpu_milli, t.memory_mib, t.num_gpu, t.gpu_milli) for t in _gpu(base)}
    assert all((t.cpu_milli, t.memory_mib, t.num_gpu, t.gpu_milli) in pool for t in g)


@pytest.mark.parametrize("pct", [20, 40, 60])
def test_multigpu_appends_copies_until_share(base, pct):
    v = make_variant(base, "multigpu", pct, 2)
    assert v[:len(base)] == base
    new = v[len(base):]
    assert new and all(kind(t) == "multi" for t in new)
    pool = {(t.cpu_milli, t.memory_mib, t.num_gpu) for t in base if kind(t) == "multi"}
    assert all((t.cpu_milli, t.memory_mib, t.num_gpu) in pool for t in new)
    share = multi_share(v)
    assert pct / 100 <= share
    assert multi_share(v[:-1]) < pct / 100  # stopped at the first crossing


@pytest.mark.parametrize("pct", [10, 25, 40])
def test_gpuspec_only_spec_changes_and_models_exist(base, nodes, pct):
    v = make_variant(base, "gpuspec", pct, 3)
    assert len(v) == len(base)
    models = {n.model for n in nodes if n.gpu_count}
    changed = 0
    for a, b in zip(base, v, strict=True):
        assert (a.name, a.cpu_milli, a.memory_mib, a.num_gpu, a.gpu_milli) == \
               (b.name, b.cpu_milli, b.memory_mib, b.num_gpu, b.gpu_milli)
        if b.gpu_spec != a.gpu_spec:
            changed += 1
            assert kind(b) != "cpu"
            assert set(b.gpu_spec) <= models
            # the task fits on some node of an allowed model
            assert any(n.model in b.gpu_spec and n.gpu_count >= b.num_gpu and n.cpu_milli >= b.cpu_milli
                       for n in nodes)
    assert changed == round(pct / 100 * len(_gpu(base)))


@pytest.mark.parametrize("pct", [10, 30])
def test_cpuheavy_doubles_a_share(base, nodes, pct):
    v = make_variant(base, "cpuheavy", pct, 4)
    cap = max(n.cpu_milli for n in nodes)
    diff = [(a, b) for a, b in zip(base, v, strict=True) if a != b]
    assert len(diff) <= round(pct / 100 * len(base))
    assert len(diff) >= round(pct / 100 * len(base)) - sum(t.cpu_milli in (0, cap) for t in base)
    for a, b in diff:
        assert b.cpu_milli == min(cap, round(a.cpu_milli * CPU_FACTOR))
        assert (a.name, a.num_gpu, a.gpu_milli, a.gpu_spec) == (b.name, b.num_gpu, b.gpu_milli, b.gpu_spec)


def test_suite_held_out_is_disjoint():
    assert not {(v.family, v.pct) for v in TUNING} & {(v.family, v.pct) for v in HELD_OUT}
    assert not {v.gen_seed for v in TUNING} & {v.gen_seed for v in HELD_OUT}
    assert len({v.name for v in SUITES["all"]}) == len(SUITES["all"])
    fams = Counter(v.family for v in HELD_OUT)
    assert set(fams) == {"gpushare", "multigpu", "gpuspec", "cpuheavy"}


def test_twins_and_fresh_rows_draw_with_seeds_of_their_own():
    from benchmarks.bench_variants import set_of
    from benchmarks.variants import FRESH, FRESH8, TWINS

    seeds = [v.gen_seed for v in SUITES["all"]]
    assert len(seeds) == len(set(seeds))  # no two rows share a generator seed
    assert {(v.family, v.pct) for v in FRESH} == {(v.family, v.pct) for v in HELD_OUT}
    assert {(v.family, v.pct) for v in FRESH8} == {(v.family, v.pct) for v in HELD_OUT}
    assert {set_of(v) for v in FRESH8} == {"fresh8"}
    assert {(v.family, v.pct) for v in TWINS} <= {(v.family, v.pct) for v in HELD_OUT}
    assert {set_of(v) for v in TWINS} == {"tuning"} and set(SUITES["tuning"]) >= set(TWINS)
    assert {set_of(v) for v in FRESH} == {"fresh"} and {set_of(v) for v in HELD_OUT} == {"held-out"}


def test_unknown_family_and_bad_pct(base):
    with pytest.raises(ValueError):
        make_variant(base, "nope", 10, 1)
    with pytest.raises(ValueError):
        make_variant(base, "gpuspec", 120, 1)


def test_a_policy_spec_carries_its_parameters_into_the_label_and_the_factory():
    from benchmarks.bench_variants import main, parse_spec

    assert parse_spec("vramfit") == ("vramfit", {})
    assert parse_spec("vramfit@fgd_share=0.5@scarcity=models") == ("vramfit", {"fgd_share": 0.5,
                                                                              "scarcity": "models"})
    assert parse_spec("paper:fgd") == ("paper:fgd", {})
    # Python's spelling of a boolean is a boolean, not the truthy string "False".
    assert parse_spec("vramfit@cpu_gap=False@x=True@y=false") == ("vramfit", {"cpu_gap": False, "x": True,
                                                                              "y": False})
    with pytest.raises(ValueError, match="key=value"):
        parse_spec("vramfit@fgd_share")
    assert main(["--policies", "vramfit@oops", "--variants", "none"]) == 2
    assert main(["--policies", "no-such-policy@x=1", "--variants", "none"]) == 2
