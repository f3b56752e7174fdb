"""MIG layout geometry from the catalog: every allowed (profile, start) placement of a GPU model, the valid
layouts as 0/1 vectors over them, the layouts a plan may choose, a GPU's current layout, and the instance a
placement creates. Used by `packing.solvers.repartition` (the plan) and `packing.solvers.capacity` (what a re-layout could
hold); it builds no model and imports neither.
"""

from __future__ import annotations

import functools

from packing.catalog import Catalog, GpuModel, Placement, all_layouts, profile_key
from packing.model import Gpu, MigInstance
from packing.vendors import product_model


def gpu_catalog_model(catalog: Catalog, gpu: Gpu) -> GpuModel | None:
    """The catalog model of a GPU: its recorded model name, else its product string."""
    if gpu.model:
        m = catalog.get(gpu.model)
        if m is not None:
            return m
    return product_model(catalog, gpu.product) if gpu.product else None


@functools.lru_cache(maxsize=64)
def layout_space(model: GpuModel) -> tuple[tuple[Placement, ...], tuple[tuple[int, ...], ...]]:
    """Every allowed (profile, start) of the model and every valid layout as a 0/1 vector over them."""
    layouts = all_layouts(model)
    placements = tuple(sorted({p for lay in layouts for p in lay}, key=lambda p: (p.start, p.profile)))
    pos = {p: i for i, p in enumerate(placements)}
    vectors = []
    for lay in layouts:
        v = [0] * len(placements)
        for p in lay:
            v[pos[p]] = 1
        vectors.append(tuple(v))
    return placements, tuple(vectors)


def _media_extended(profile: str) -> bool:
    # `+me` and similar variants carry media engines, not more memory: a plan never needs a new one.
    return "+" in profile


@functools.lru_cache(maxsize=256)
def choice_space(model: GpuModel, keep: frozenset[int]) -> tuple[tuple[int, ...], ...]:
    """Valid layouts (as vectors) that create no new media-extended instance; `keep` = ones that exist now."""
    placements, vectors = layout_space(model)
    banned = [i for i, p in enumerate(placements) if _media_extended(p.profile) and i not in keep]
    return tuple(v for v in vectors if not any(v[i] for i in banned))


def instance_for(catalog: Catalog, model: GpuModel, gpu: Gpu, pl: Placement) -> MigInstance:
    """The MIG instance a placement would create; memory as the node reports it for that profile, else the catalog's."""
    assert model.mig is not None
    prof = model.mig.profile(pl.profile)
    assert prof is not None
    reported = next((i.memory_mib for i in gpu.mig if profile_key(i.profile) == profile_key(prof.name)), None)
    for inst in gpu.mig:  # an instance that stays keeps its identity (uuid)
        if profile_key(inst.profile) == profile_key(prof.name) and inst.start == pl.start:
            return inst
    mem = catalog.profile_memory(model, prof.name, reported)
    return MigInstance(prof.name, pl.start, prof.memory_slices, prof.compute_slices, mem)


def current_vector(model: GpuModel, gpu: Gpu) -> tuple[int, ...] | None:
    """The GPU's layout as a 0/1 vector, or None when it is not one the catalog knows."""
    placements, vectors = layout_space(model)
    index = {(profile_key(p.profile), p.start): i for i, p in enumerate(placements)}
    v = [0] * len(placements)
    for inst in gpu.mig:
        i = index.get((profile_key(inst.profile), inst.start))
        if i is None:
            return None
        v[i] = 1
    t = tuple(v)
    return t if t in set(vectors) else None


# ------------------------------------------------------------------------------------------- results
