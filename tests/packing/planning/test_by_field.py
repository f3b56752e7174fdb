"""packing.planning.by_field: the planner pickles and copies the state's objects by field, to equal objects of the
same type, and leaves the originals' attributes inline; the core's types carry nothing of it."""

from __future__ import annotations

import gc
import pickle
from dataclasses import dataclass, fields

from solver_fixtures import random_cluster, random_pending

from packing.model import Gpu, Mode
from packing.planning.by_field import BY_FIELD, copy_by_field, dumps
from packing.planning.working_copy import copy_usage
from packing.usage import GpuUsage


def _has_attribute_dict(obj: object) -> bool:
    """A materialised attribute dict shows as a dict among the object's referents."""
    names = {f.name for f in fields(obj)}  # type: ignore[arg-type]
    return any(isinstance(r, dict) and names & set(r) for r in gc.get_referents(obj))


@dataclass(frozen=True)
class _Plain:
    gpu: int = 1


def test_a_cluster_view_round_trips_through_the_planners_pickle() -> None:
    state = random_cluster(7, n_nodes=6, max_gpus=3, n_existing=4)
    for nu in state._nodes:
        twin = pickle.loads(dumps(nu))
        assert twin == nu and type(twin) is type(nu)
        assert twin.node.labels == nu.node.labels  # compare=False: checked by hand
        assert all(a.rules is not None and type(a.rules) is type(b.rules) for a, b in zip(twin.gpus, nu.gpus, strict=True))
    for p in random_pending(7, 5):
        again = pickle.loads(dumps(p))
        assert again == p and hash(again) == hash(p) and again.shape == p.shape


def test_a_copy_is_the_same_mutable_books_not_shared_ones() -> None:
    gu = GpuUsage(Gpu(0, 81920, Mode.MPS, "NVIDIA-A100-SXM4-80GB"))
    gu.used_mib = 4000
    twin = copy_by_field(gu)
    twin.tenants = dict(gu.tenants)
    twin.tenants["a"] = 1
    assert gu.tenants == {} and twin.used_mib == 4000 and twin == GpuUsage(gu.gpu, used_mib=4000, tenants={"a": 1})


def test_pickling_and_copying_leave_the_objects_attributes_inline() -> None:
    """The point of the wing's pickler: after a pickle or a working copy the originals have no attribute dict (a
    materialised one makes every later attribute read of the live view slower)."""
    state = random_cluster(3, n_nodes=3, max_gpus=2, n_existing=2)
    objs = [x for nu in state._nodes for x in (nu, nu.node, *nu.gpus, *(g.gpu for g in nu.gpus))]
    objs += [x for h in state._holders.values() for x in (h, h.pod, h.assignment, *h.assignment.gpus)]
    assert {type(o) for o in objs} >= {t for t in BY_FIELD if t.__name__ != "MigInstance"}
    copies = pickle.loads(dumps(objs))
    for nu in state._nodes:
        copy_usage(nu)
    for o in [*objs, *copies]:
        assert not _has_attribute_dict(o), type(o)

    plain = _Plain()  # the default reduce, for contrast: the check above can see a materialised dict
    pickle.dumps(plain)
    assert _has_attribute_dict(plain)


def test_the_core_types_carry_no_pickling_of_their_own() -> None:
    """The core does not know the planner: its types use object's reduce, the wing's table does the rest."""
    for cls in BY_FIELD:
        assert "__reduce__" not in vars(cls) and "__reduce_ex__" not in vars(cls), cls
