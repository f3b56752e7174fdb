"""Dynamic MIG: instances created on demand. The GPU lists every placement its geometry allows
(`Gpu.mig`, overlapping each other: Kubernetes DRA's partitionable devices, one per profile@start); a grant
names one, and it may be held while no held placement covers one of its memory slices and the held
placements' compute slices together stay within the GPU's.

The books are MIG's: `mig_holder` maps a held placement's ref (`<profile>@<start>`) to its pod. What stays
free is not a list of instances but whatever placements still fit beside the held ones, so the rules answer
from a small search over the memory slices (`_Geometry`), cached per placement list.

Accounting (what the conformance suite checks, `tests/packing/test_mode_conformance.py`):
- capacity: the most memory one layout of the placements gives (the whole-GPU profile on an empty GPU);
- `pool_free`: capacity minus the memory of the held placements (what no pod holds);
- of that, what no set of free placements can still give (a memory slice no free placement can cover, the
  compute the held ones leave, the profiles' rounding) is stranded, with each held placement's memory above
  its grant, as under static MIG.

Media engines: at most one `+me` placement is held at once (it owns the GPU's decoders, JPEG and OFA engines,
the counters DRA publishes beside the slices); a plain placement of the same slices gives the same memory, so
the search below ignores the rule, and `candidate` picks a `+me` placement only where no plain one fits (a pod
placed by VRAM has no use for the engines; but a GPU publishing only some placements may offer the memory in a
`+me` one alone, and the views count it free, so the filter and the offer must agree).

The GPU's compute slices are those of its largest placement (the whole-GPU profile, 7g on A100/H100): every
partitionable GPU publishes that placement, and where a list lacks it the limit is only tighter (refusals,
never a layout the hardware rejects). A profile's `max_count` is not checked beyond that: on the catalog's
GPUs slices and compute imply it for every profile but `+me`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

from packing.catalog.types import GpuModel
from packing.model import GpuGrant, MigInstance, Mode, PodDemand
from packing.modes.base import ModeRules, Usage
from packing.modes.mig import MIG_ONE_PER_PROCESS, named_place

MEDIA_SUFFIX = "+me"  # profiles that own the GPU's media engines (at most one per GPU)


def placements_for(model: GpuModel) -> tuple[MigInstance, ...]:
    """Every profile@start the catalog geometry of `model` allows (memory from the catalog), sorted by start
    then size; () for a model without MIG. The placements a partitionable GPU of that model publishes."""
    geo = model.mig
    if geo is None:
        return ()
    out = [MigInstance(prof.name, start, prof.memory_slices, prof.compute_slices, prof.memory_mib)
           for prof in geo.profiles.values() for start in prof.allowed_starts
           if 0 <= start and start + prof.memory_slices <= geo.memory_slices]
    return tuple(sorted(out, key=lambda i: (i.start, i.memory_slices, i.compute_slices, i.profile)))


def _mask(inst: MigInstance) -> int:
    return ((1 << inst.memory_slices) - 1) << inst.start


@dataclass(frozen=True)
class Reach:
    """What free placements can still give together: the most memory, the most instances (each on its own
    best layout)."""

    memory_mib: int
    count: int


@dataclass
class _Geometry:
    """One placement list, searched: the best extension of any set of held slices and compute."""

    placements: tuple[MigInstance, ...]
    compute: int = 0
    slices: int = 0
    by_start: dict[int, list[MigInstance]] = field(default_factory=dict)
    _memo: dict[tuple[int, int, int], Reach] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.compute = max((i.compute_slices for i in self.placements), default=0)
        self.slices = max((i.start + i.memory_slices for i in self.placements), default=0)
        for inst in self.placements:
            self.by_start.setdefault(inst.start, []).append(inst)

    def reach(self, used: int, compute: int, first: int = 0) -> Reach:
        """The best extension of held slices `used` and compute `compute`, from memory slice `first` on:
        walk the slices in order; at each, leave it or start one placement there."""
        key = (used, compute, first)
        hit = self._memo.get(key)
        if hit is not None:
            return hit
        if first >= self.slices:
            best = Reach(0, 0)
        else:
            best = self.reach(used, compute, first + 1)
            for inst in self.by_start.get(first, ()):
                if used & _mask(inst) or compute + inst.compute_slices > self.compute:
                    continue
                rest = self.reach(used | _mask(inst), compute + inst.compute_slices, first + 1)
                best = Reach(max(best.memory_mib, rest.memory_mib + inst.memory_mib),
                             max(best.count, rest.count + 1))
        self._memo[key] = best
        return best


@functools.lru_cache(maxsize=256)
def _geometry(placements: tuple[MigInstance, ...]) -> _Geometry:
    return _Geometry(placements)


@dataclass(frozen=True)
class _Books:
    """One GPU's held placements, as the search reads them."""

    geo: _Geometry
    held: tuple[MigInstance, ...]
    used: int  # memory slices the held placements cover
    compute: int  # compute slices they take

    @staticmethod
    def of(gu: Usage) -> _Books:
        held = tuple(inst for ref in gu.mig_holder if (inst := gu.gpu.instance(ref)) is not None)
        used = 0
        for inst in held:
            used |= _mask(inst)
        return _Books(_geometry(gu.gpu.mig), held, used, sum(i.compute_slices for i in held))

    def fits(self, inst: MigInstance) -> bool:
        """`inst` may be created beside the held placements."""
        return (not self.used & _mask(inst) and self.compute + inst.compute_slices <= self.geo.compute
                and not (_media(inst) and any(_media(i) for i in self.held)))

    def free(self) -> list[MigInstance]:
        return [i for i in self.geo.placements if self.fits(i)]

    def reach(self) -> Reach:
        return self.geo.reach(self.used, self.compute)

    def after(self, inst: MigInstance) -> Reach:
        return self.geo.reach(self.used | _mask(inst), self.compute + inst.compute_slices)

    def capacity(self) -> int:
        return self.geo.reach(0, 0).memory_mib


def _media(inst: MigInstance) -> bool:
    return inst.profile.endswith(MEDIA_SUFFIX)


def _overlap(books: _Books, inst: MigInstance) -> str | None:
    for other in books.held:
        if _mask(other) & _mask(inst):
            return f"MIG placement {inst.ref} overlaps held placement {other.ref}"
    return None


class MigDynamic(ModeRules):
    name = "mig-dynamic"
    mode = Mode.MIG_DYNAMIC
    instanced = True
    words = "dynamically MIG-partitioned"
    cap_words = "largest MIG placement"
    pod_group = "mig"  # the same devices to a process as static MIG instances
    group_words = "MIG instances"
    multi_gpu_group = "per-process"
    multi_gpu_why = MIG_ONE_PER_PROCESS

    def layout_for(self, model: GpuModel) -> tuple[MigInstance, ...]:
        """Every placement the geometry of `model` allows: what a partitionable GPU of it publishes."""
        return placements_for(model)

    def max_pods(self, gu: Usage) -> int:
        # The pods holding placements now and as many more as free placements can still hold together.
        return gu.pods + _Books.of(gu).reach().count

    def unit_max(self, gu: Usage) -> int:
        return max((i.memory_mib for i in _Books.of(gu).free()), default=0)

    def unit_cap(self, gu: Usage) -> int:
        return max((i.memory_mib for i in gu.gpu.mig), default=0)

    def pool_free(self, gu: Usage) -> int:
        books = _Books.of(gu)
        return max(0, books.capacity() - sum(i.memory_mib for i in books.held))

    def free_instance_sizes(self, gu: Usage) -> list[int]:
        # The sizes a new pod could get, once each: the placements overlap, so they are not instances to
        # count, but "the smallest free unit >= v" (the policies' take) and "any >= v" read right.
        return sorted({i.memory_mib for i in _Books.of(gu).free()})

    def free_units(self, gu: Usage) -> list[MigInstance]:
        # The solvers count these as independent units, so they must not overlap: largest first, lowest start,
        # each beside the held ones and those taken before. Any pod that fits now fits one of them.
        books = _Books.of(gu)
        chosen: list[MigInstance] = []
        for inst in sorted(books.free(), key=lambda i: (-i.memory_mib, i.start, i.compute_slices)):
            if books.fits(inst):
                chosen.append(inst)
                books = _Books(books.geo, (*books.held, inst), books.used | _mask(inst),
                               books.compute + inst.compute_slices)
        return chosen

    def pool(self, gu: Usage) -> int | None:
        return gu.gpu.memory_mib - gu.used_mib if gu.whole_holder is not None else None

    def stranded_mib(self, gu: Usage) -> int:
        books = _Books.of(gu)
        inside = sum(inst.memory_mib - gu.grants[holder].vram_mib for inst in books.held
                     if (holder := gu.mig_holder.get(inst.ref)) is not None and holder in gu.grants)
        return inside + max(0, self.pool_free(gu) - books.reach().memory_mib)

    def grant_problem(self, gu: Usage, pod: PodDemand, grant: GpuGrant, relax_tenancy: bool) -> str | None:
        inst, problem = named_place(gu, grant, "dynamic MIG GPU", "placement")
        if inst is None:
            return problem
        books = _Books.of(gu)
        overlap = _overlap(books, inst)
        if overlap is not None:
            return overlap
        if books.compute + inst.compute_slices > books.geo.compute:
            return (f"MIG placement {grant.mig} needs {inst.compute_slices} compute slices, "
                    f"{books.geo.compute - books.compute} of {books.geo.compute} free")
        if not books.fits(inst):
            return f"MIG placement {grant.mig}: a {MEDIA_SUFFIX} placement already holds the media engines"
        if pod.vram_mib > inst.memory_mib:
            return f"needs {pod.vram_mib} MiB, placement {grant.mig} has {inst.memory_mib} MiB"
        return None

    def candidate(self, gu: Usage, pod: PodDemand) -> tuple[GpuGrant | None, int, str | None]:
        v = pod.vram_mib
        books = _Books.of(gu)
        free = books.free()
        fitting = [i for i in free if i.memory_mib >= v]
        if not fitting:
            sizes = ", ".join(str(s) for s in sorted({i.memory_mib for i in free})) or "none"
            return None, 0, f"no free MIG placement >= {v} MiB (free sizes: {sizes})"
        inst = min(fitting, key=lambda i: (_media(i), *_best_fit_key(books, i)))
        return GpuGrant(index=gu.gpu.index, vram_mib=v, mig=inst.ref), inst.memory_mib, None

    def booking_problem(self, gu: Usage, grant: GpuGrant) -> str | None:
        if grant.mig is not None:
            inst = gu.gpu.instance(grant.mig)
            if inst is None:
                return f"no MIG placement {grant.mig}"
            if grant.mig in gu.mig_holder:
                return f"MIG placement {grant.mig} is held by {gu.mig_holder[grant.mig]}"
            return _overlap(_Books.of(gu), inst)
        if not grant.whole:
            return "dynamic MIG GPU needs a MIG placement in the grant"
        return None


def _best_fit_key(books: _Books, inst: MigInstance) -> tuple[int, int, int, int, int]:
    """Order of the placements that fit a pod: the smallest memory (best fit: big placements stay for big
    pods), the fewest compute slices (1g.20gb before 2g.20gb: compute left for more pods), the most memory
    free placements can still give afterwards, then the largest placement still free afterwards (a
    small instance at the edge, not in the middle of a big one's slices), then the lowest start."""
    after = books.after(inst)
    used = books.used | _mask(inst)
    compute = books.compute + inst.compute_slices
    largest = max((i.memory_mib for i in books.geo.placements
                   if not used & _mask(i) and compute + i.compute_slices <= books.geo.compute), default=0)
    return inst.memory_mib, inst.compute_slices, -after.memory_mib, -largest, inst.start


MIG_DYNAMIC = MigDynamic()
