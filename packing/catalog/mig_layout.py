"""MIG layouts: checking a layout against a model's geometry, deriving one from profile counts, the named
mig-parted configs, and every valid layout of a model.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping

from packing.catalog.types import MIG_DISABLED_CONFIG, GpuModel, MigGeometry, Placement


def layout_problems(model: GpuModel, layout: Iterable[Placement]) -> list[tuple[int | None, str | None, str]]:
    """(instance index or None, offending attribute "profile"/"start" or None, message) per broken rule."""
    items = list(layout)
    if model.mig is None:
        return [(None, None, f"{model.name} does not support MIG")] if items else []
    geo = model.mig
    out: list[tuple[int | None, str | None, str]] = []
    spans: list[tuple[int, int, int, str]] = []  # (first, end, index, ref)
    per_profile: dict[str, int] = {}
    compute = 0
    for i, pl in enumerate(items):
        ref = f"{pl.profile}@{pl.start}"
        prof = geo.profile(pl.profile)
        if prof is None:
            out.append((i, "profile", f"instance {i} ({ref}): {model.name} has no MIG profile {pl.profile!r} "
                           f"(known: {', '.join(geo.profiles)})"))
            continue
        if pl.start not in prof.allowed_starts:
            out.append((i, "start", f"instance {i} ({ref}): start {pl.start} is not an allowed start for {prof.name} "
                           f"(allowed: {', '.join(map(str, prof.allowed_starts))})"))
        end = pl.start + prof.memory_slices
        if pl.start < 0 or end > geo.memory_slices:
            out.append((i, "start", f"instance {i} ({ref}): memory slices {pl.start}-{end - 1} are outside the GPU's "
                           f"0-{geo.memory_slices - 1}"))
        for first, last, j, other in spans:
            if pl.start < last and first < end:
                lo, hi = max(first, pl.start), min(last, end) - 1
                out.append((i, "start", f"instance {i} ({ref}) overlaps instance {j} ({other}) on memory slices {lo}-{hi}"))
        spans.append((pl.start, end, i, ref))
        per_profile[prof.name] = per_profile.get(prof.name, 0) + 1
        if per_profile[prof.name] == prof.max_count + 1:
            out.append((i, "profile", f"instance {i} ({ref}): more than {prof.max_count} instance(s) of {prof.name}"))
        compute += prof.compute_slices
        if len(spans) == geo.max_instances + 1:
            out.append((i, None, f"instance {i} ({ref}): more than {geo.max_instances} instances on one GPU"))
    if compute > geo.compute_slices:
        out.append((None, None, f"layout uses {compute} compute slices, the GPU has {geo.compute_slices}"))
    return out


def validate_layout(model: GpuModel, layout: Iterable[Placement]) -> list[str]:
    """Every rule the layout breaks, in words naming the instance; empty = valid."""
    return [msg for _, _, msg in layout_problems(model, layout)]


def _canonical_counts(geo: MigGeometry, counts: Mapping[str, int]) -> dict[str, int]:
    out: dict[str, int] = {}
    for name, n in counts.items():
        prof = geo.profile(name)
        if prof is None:
            raise ValueError(f"unknown MIG profile {name!r} (known: {', '.join(geo.profiles)})")
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"count for {name} must be a non-negative integer, got {n!r}")
        if n:
            out[prof.name] = out.get(prof.name, 0) + n
    return out


def derive_layout_geometry(geo: MigGeometry, counts: Mapping[str, int]) -> list[Placement] | None:
    """derive_layout on a bare geometry (used while loading, before the model exists)."""
    want = _canonical_counts(geo, counts)
    if sum(want.values()) > geo.max_instances:
        return None
    if sum(geo.profiles[p].compute_slices * n for p, n in want.items()) > geo.compute_slices:
        return None
    if sum(geo.profiles[p].memory_slices * n for p, n in want.items()) > geo.memory_slices:
        return None
    if any(n > geo.profiles[p].max_count for p, n in want.items()):
        return None
    # Larger profiles first: they have the fewest allowed starts, so failures show up early.
    order = sorted(want, key=lambda p: (-geo.profiles[p].memory_slices, -geo.profiles[p].compute_slices, p))
    todo = [p for p in order for _ in range(want[p])]
    chosen: list[Placement] = []

    def place(k: int, used: int) -> bool:
        if k == len(todo):
            return True
        prof = geo.profiles[todo[k]]
        # Identical instances take increasing starts, so each set is tried once.
        floor = chosen[-1].start + 1 if k > 0 and todo[k - 1] == todo[k] else 0
        for s in prof.allowed_starts:
            if s < floor:
                continue
            mask = ((1 << prof.memory_slices) - 1) << s
            if used & mask:
                continue
            chosen.append(Placement(prof.name, s))
            if place(k + 1, used | mask):
                return True
            chosen.pop()
        return False

    if not place(0, 0):
        return None
    return sorted(chosen, key=lambda p: (p.start, p.profile))


def derive_layout(model: GpuModel, counts: Mapping[str, int]) -> list[Placement] | None:
    """A valid layout on ONE GPU holding exactly these instance counts, or None if impossible.

    Raises ValueError for a profile the model does not have (or a non-MIG model asked for instances).
    """
    if model.mig is None:
        if any(counts.values()):
            raise ValueError(f"{model.name} does not support MIG")
        return None
    return derive_layout_geometry(model.mig, counts)


def max_fit(model: GpuModel, profile: str) -> int:
    """How many instances of one profile fit on an empty GPU (the `all-<profile>` config)."""
    if model.mig is None:
        return 0
    prof = model.mig.profile(profile)
    if prof is None:
        raise ValueError(f"{model.name} has no MIG profile {profile!r}")
    for n in range(prof.max_count, 0, -1):
        if derive_layout(model, {prof.name: n}) is not None:
            return n
    return 0


def named_layout(model: GpuModel, config_name: str) -> list[Placement] | None:
    """The per-GPU layout of a mig-parted / GPU Operator config name.

    `all-disabled` -> None (MIG off: the GPU is used whole); `all-enabled` -> [] (MIG on, no instances);
    `all-<profile>` (`+` written `.`) -> as many of that profile as fit; `all-balanced` -> the model's balanced
    counts. Raises ValueError for a name this model does not define (custom configs: derive from counts instead).
    """
    name = config_name.strip().lower()
    if name == MIG_DISABLED_CONFIG:
        return None
    if model.mig is None:
        raise ValueError(f"{model.name} does not support MIG (config {config_name!r})")
    if name == "all-enabled":
        return []
    if name == "all-balanced":
        if model.mig.balanced is None:
            raise ValueError(f"{model.name} has no all-balanced config")
        layout = derive_layout(model, dict(model.mig.balanced))
        if layout is None:  # pragma: no cover - checked when the catalog loads
            raise ValueError(f"{model.name}: all-balanced counts do not fit")
        return layout
    if name.startswith("all-"):
        prof = model.mig.profile(name[len("all-"):])
        if prof is not None:
            n = max_fit(model, prof.name)
            layout = derive_layout(model, {prof.name: n})
            if layout is not None:
                return layout
    raise ValueError(f"unknown MIG config {config_name!r} for {model.name}")


@functools.lru_cache(maxsize=256)
def _all_layouts(model: GpuModel) -> tuple[tuple[Placement, ...], ...]:
    geo = model.mig
    if geo is None:
        return ()
    profiles = sorted(geo.profiles.values(), key=lambda p: (-p.memory_slices, -p.compute_slices, p.name))
    out: list[tuple[Placement, ...]] = []
    chosen: list[Placement] = []
    counts = {p.name: 0 for p in profiles}

    # Walk the memory slices in order; at each one either leave it or start one instance there.
    def walk(slice_: int, used: int, compute: int) -> None:
        if slice_ >= geo.memory_slices:
            out.append(tuple(chosen))
            return
        walk(slice_ + 1, used, compute)
        if used >> slice_ & 1 or len(chosen) >= geo.max_instances:
            return
        for p in profiles:
            if slice_ not in p.allowed_starts or counts[p.name] >= p.max_count:
                continue
            if compute + p.compute_slices > geo.compute_slices:
                continue
            mask = ((1 << p.memory_slices) - 1) << slice_
            if used & mask:
                continue
            chosen.append(Placement(p.name, slice_))
            counts[p.name] += 1
            walk(slice_ + 1, used | mask, compute + p.compute_slices)
            counts[p.name] -= 1
            chosen.pop()

    walk(0, 0, 0)
    return tuple(out)


def all_layouts(model: GpuModel) -> list[tuple[Placement, ...]]:
    """Every valid layout of one GPU (distinct sets of placements, each sorted by start; includes the empty one)."""
    return list(_all_layouts(model))


def _counts_of(layout: Iterable[Placement]) -> dict[str, int]:
    out: dict[str, int] = {}
    for p in layout:
        out[p.profile] = out.get(p.profile, 0) + 1
    return out


@functools.lru_cache(maxsize=256)
def _count_vectors(model: GpuModel) -> tuple[tuple[str, ...], tuple[tuple[int, ...], ...]]:
    """Profile order and every distinct per-GPU count vector some valid layout achieves."""
    assert model.mig is not None
    names = tuple(model.mig.profiles)
    seen: set[tuple[int, ...]] = set()
    for layout in _all_layouts(model):
        c = _counts_of(layout)
        seen.add(tuple(c.get(n, 0) for n in names))
    return names, tuple(sorted(seen))


def distribute_counts(model: GpuModel, n_gpus: int, counts: Mapping[str, int]) -> list[list[Placement]] | None:
    """Split node-wide instance counts over n GPUs so that every GPU's layout is valid; None if impossible.

    Prefers identical GPUs (and otherwise GPUs as close to the average as possible). Raises ValueError for a
    profile the model does not have.
    """
    if n_gpus < 0:
        raise ValueError("n_gpus must be >= 0")
    if model.mig is None:
        if any(counts.values()):
            raise ValueError(f"{model.name} does not support MIG")
        return None
    want = _canonical_counts(model.mig, counts)
    if n_gpus == 0:
        return [] if not want else None
    if all(n % n_gpus == 0 for n in want.values()):
        same = derive_layout(model, {p: n // n_gpus for p, n in want.items()})
        if same is not None:
            return [list(same) for _ in range(n_gpus)]
    names, vectors = _count_vectors(model)
    target = tuple(want.get(n, 0) for n in names)
    search = _VectorSearch(model.mig, names, vectors, target, n_gpus)
    if not search.search(target, n_gpus, 0):
        return None
    out: list[list[Placement]] = []
    for v in search.picked:
        layout = derive_layout(model, {n: c for n, c in zip(names, v, strict=True) if c})
        assert layout is not None  # every vector comes from a valid layout
        out.append(layout)
    return out


class _VectorSearch:
    """Depth-first search for one per-GPU count vector per GPU that together make the node-wide counts."""

    def __init__(self, geo: MigGeometry, names: tuple[str, ...], vectors: tuple[tuple[int, ...], ...],
                 target: tuple[int, ...], n_gpus: int) -> None:
        self.geo = geo
        mean = [t / n_gpus for t in target]
        # Closest to the average first, so the first solution found is as even as the geometry allows.
        self.ordered = sorted(vectors, key=lambda v: (sum(abs(a - b) for a, b in zip(v, mean, strict=True)), v))
        self.profs = [geo.profiles[n] for n in names]
        self.per_gpu_max = [max(v[i] for v in vectors) for i in range(len(names))]
        self.dead: set[tuple[tuple[int, ...], int, int]] = set()
        self.picked: list[tuple[int, ...]] = []

    def hopeless(self, rest: tuple[int, ...], gpus: int) -> bool:
        # Cheap bounds that cut impossible branches (and impossible inputs) short.
        geo, profs = self.geo, self.profs
        if any(r > gpus * m for r, m in zip(rest, self.per_gpu_max, strict=True)):
            return True
        if sum(rest) > gpus * geo.max_instances:
            return True
        if sum(r * p.memory_slices for r, p in zip(rest, profs, strict=True)) > gpus * geo.memory_slices:
            return True
        return sum(r * p.compute_slices for r, p in zip(rest, profs, strict=True)) > gpus * geo.compute_slices

    def search(self, rest: tuple[int, ...], gpus: int, first: int) -> bool:
        if gpus == 0:
            return not any(rest)
        key = (rest, gpus, first)
        if key in self.dead or self.hopeless(rest, gpus):
            return False
        for k in range(first, len(self.ordered)):
            v = self.ordered[k]
            if any(a > b for a, b in zip(v, rest, strict=True)):
                continue
            self.picked.append(v)
            # Vectors are taken in non-decreasing list order: each multiset of GPUs is tried once.
            if self.search(tuple(b - a for a, b in zip(v, rest, strict=True)), gpus - 1, k):
                return True
            self.picked.pop()
        self.dead.add(key)
        return False
