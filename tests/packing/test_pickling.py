"""packing.pickling: the state's objects pickle and copy by field, to equal objects of the same type (the planner
copies the whole view to its worker this way)."""

from __future__ import annotations

import copy
import pickle
from dataclasses import dataclass, fields

from solver_fixtures import random_cluster, random_pending

from packing.model import Gpu, Mode
from packing.pickling import inline_pickle
from packing.usage import GpuUsage


def test_a_cluster_view_round_trips_through_pickle_and_deepcopy() -> None:
    state = random_cluster(7, n_nodes=6, max_gpus=3, n_existing=4)
    for nu in state._nodes:
        for twin in (pickle.loads(pickle.dumps(nu)), copy.deepcopy(nu)):
            assert twin == nu and type(twin) is type(nu)
            assert twin.node.labels == nu.node.labels  # compare=False: checked by hand
            assert all(a.rules is not None and type(a.rules) is type(b.rules) for a, b in zip(twin.gpus, nu.gpus, strict=True))
    for p in random_pending(7, 5):
        again = pickle.loads(pickle.dumps(p))
        assert again == p and hash(again) == hash(p) and again.shape == p.shape


def test_a_copy_is_the_same_mutable_books_not_shared_ones() -> None:
    gu = GpuUsage(Gpu(0, 81920, Mode.MPS, "NVIDIA-A100-SXM4-80GB"))
    gu.used_mib = 4000
    twin = copy.deepcopy(gu)
    twin.tenants["a"] = 1
    assert gu.tenants == {} and twin.used_mib == 4000


@inline_pickle
@dataclass(frozen=True)
class _Base:
    a: int


@dataclass(frozen=True)
class _Child(_Base):
    b: str = "x"


@dataclass(frozen=True)
class _Plain:
    gpu: int = 1


def test_a_subclass_keeps_its_own_fields() -> None:
    c = pickle.loads(pickle.dumps(_Child(1, "y")))
    assert type(c) is _Child and (c.a, c.b) == (1, "y")


def test_pickling_leaves_the_objects_attributes_inline() -> None:
    """The point of `inline_pickle`: after a pickle the original has no attribute dict (a materialised one shows
    as a dict among the object's referents, and makes every later attribute read slower)."""
    import gc

    state = random_cluster(3, n_nodes=3, max_gpus=2, n_existing=2)
    objs = [x for nu in state._nodes for x in (nu, nu.node, *nu.gpus, *(g.gpu for g in nu.gpus))]
    pickle.dumps(objs)
    copy.deepcopy(objs)
    for o in objs:
        names = {f.name for f in fields(o)}
        assert not any(isinstance(r, dict) and names & set(r) for r in gc.get_referents(o)), type(o)

    plain = _Plain()  # the default reduce, for contrast: the check above can see a materialised dict
    pickle.dumps(plain)
    assert any(isinstance(r, dict) and "gpu" in r for r in gc.get_referents(plain))
