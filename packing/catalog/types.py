"""The catalog's types: GPU models, MIG geometry and profiles, product names, layout placements. Taking a
product string apart is the vendor's (`packing.vendors.base.Vendor.resolve_product`); the catalog matches the base.

Layouts are lists of `Placement(profile, start)`; `start` is the first memory slice, and an instance occupies memory
slices `[start, start + memory_slices)` (NVML placement semantics). "Memory slices" are NVML's placement units, so
starts compare directly with what `nvidia-smi mig -lgipp` / `-lgi` print: 8 on the 7-way GPUs, 4 on A30, 12 on the
RTX PRO 6000 (a 1g instance there spans 3 units).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

MIG_DISABLED_CONFIG = "all-disabled"


def profile_key(name: str) -> str:
    """Normalised profile name: case-insensitive, `+` and `.` equivalent.

    Kubernetes label keys and mig-parted config names cannot carry `+`, so `1g.10gb+me` appears as `1g.10gb.me`.
    """
    return name.strip().lower().replace("+", ".")


@dataclass(frozen=True)
class MigProfile:
    """One GPU-instance profile of a MIG-capable model."""

    name: str  # canonical, e.g. "1g.10gb+me"
    profile_id: int | None
    compute_slices: int
    memory_slices: int
    max_count: int
    allowed_starts: tuple[int, ...]
    memory_mib: int
    unverified: tuple[str, ...] = ()  # fields that are not confirmed (e.g. "memory_mib", "allowed_starts")
    sm_count: int | None = None
    notes: str = ""


@dataclass(frozen=True)
class MigGeometry:
    """Slices of a MIG-capable model and its profiles (keyed by canonical name)."""

    compute_slices: int
    memory_slices: int  # NVML placement units of the whole GPU (not always one per compute slice)
    max_instances: int
    profiles: dict[str, MigProfile] = field(hash=False)
    balanced: tuple[tuple[str, int], ...] | None = None  # all-balanced counts per GPU; None = not defined

    def profile(self, name: str) -> MigProfile | None:
        """Look a profile up by name, case-insensitively, treating `+` and `.` alike."""
        found = self.profiles.get(name)
        if found is not None:
            return found
        key = profile_key(name)
        for prof in self.profiles.values():
            if profile_key(prof.name) == key:
                return prof
        return None


@dataclass(frozen=True)
class GpuModel:
    """A GPU model: total memory (MiB) and MIG geometry (None = no MIG)."""

    name: str
    memory_mib: int
    mig: MigGeometry | None
    products: tuple[str, ...]
    family: str = ""
    unverified: tuple[str, ...] = ()  # "entry" = whole entry; else field names such as "memory_mib"
    source: str = ""
    notes: str = ""


@dataclass(frozen=True)
class ProductInfo:
    """A vendor's product string taken apart (`packing.vendors.base.Vendor.resolve_product`; NVIDIA: a GFD
    `nvidia.com/gpu.product` value)."""

    raw: str
    base: str  # without the suffixes (NVIDIA: `-SHARED` / `-MIG-<profile>`)
    model: GpuModel | None  # None = unknown product: use node-reported memory, treat as non-MIG
    shared: bool = False  # replicated by time-slicing / MPS and not renamed (NVIDIA: `-SHARED`)
    mig_profile: str | None = None  # a hardware-instance device (NVIDIA: `-MIG-<profile>`, strategy single);
    # the canonical name when the model knows it
    mig_invalid: bool = False  # NVIDIA's `-MIG-INVALID`: strategy single with mixed profiles, nothing usable


@dataclass(frozen=True, order=True)
class Placement:
    """One MIG instance in a layout: profile and first memory slice."""

    profile: str
    start: int

    @property
    def ref(self) -> str:
        return f"{self.profile}@{self.start}"


def _tokens(text: str, ignore: frozenset[str]) -> tuple[str, ...]:
    parts = [t for t in re.split(r"[^0-9A-Za-z]+", text.upper()) if t]
    return tuple(t for t in parts if t not in ignore)


@dataclass(frozen=True)
class _ModelIndex:
    """The catalog's names and products as words, without the words a vendor says name no model."""

    exact: dict[tuple[str, ...], GpuModel]  # the whole word sequence; later models (overrides) win on collisions
    alias: tuple[tuple[frozenset[str], GpuModel], ...]

    @classmethod
    def build(cls, models: Iterable[GpuModel], ignore: frozenset[str]) -> _ModelIndex:
        exact: dict[tuple[str, ...], GpuModel] = {}
        alias: list[tuple[frozenset[str], GpuModel]] = []
        for m in models:
            for p in (m.name, *m.products):
                toks = _tokens(p, ignore)
                if toks:
                    exact[toks] = m
                    alias.append((frozenset(toks), m))
        return cls(exact, tuple(alias))


class Catalog:
    """All known GPU models and the product-string index over them."""

    def __init__(self, models: Iterable[GpuModel]) -> None:
        self.models: dict[str, GpuModel] = {}
        for m in models:
            self.models[m.name] = m
        self._by_lower = {name.lower(): m for name, m in self.models.items()}
        self._indexes: dict[frozenset[str], _ModelIndex] = {}  # by the words ignored: one per vendor

    def get(self, name: str) -> GpuModel | None:
        return self.models.get(name) or self._by_lower.get(name.lower())

    def match_model(self, base: str, ignore: frozenset[str] = frozenset()) -> GpuModel | None:
        """Model for a product string without suffixes, compared word by word (case-insensitive) with the models'
        names and products; None when unknown or ambiguous. `ignore`: upper-case words the product's vendor says
        name no model (its brand), left out on both sides."""
        index = self._indexes.get(ignore)
        if index is None:
            index = self._indexes[ignore] = _ModelIndex.build(self.models.values(), ignore)
        toks = _tokens(base, ignore)
        if not toks:
            return None
        exact = index.exact.get(toks)
        if exact is not None:
            return exact
        # Fallback: the model whose longest alias is wholly contained in the product's words, e.g.
        # "NVIDIA-A100-SXM4-80GB-XL" contains "A100-80GB". Ties between different models are ambiguous.
        have = set(toks)
        best_len = 0
        best: set[str] = set()
        for alias, m in index.alias:
            if alias <= have:
                if len(alias) > best_len:
                    best_len, best = len(alias), {m.name}
                elif len(alias) == best_len:
                    best.add(m.name)
        if len(best) == 1:
            return self.models[best.pop()]
        return None

    def profile_memory(self, model: GpuModel | str, profile: str, node_reported: int | None = None) -> int:
        """MIG instance memory: the node's figure when it reports one, else the catalog's. KeyError if unknown."""
        if node_reported is not None and node_reported > 0:
            return node_reported
        m = self.get(model) if isinstance(model, str) else model
        if m is None or m.mig is None:
            raise KeyError(f"{model if isinstance(model, str) else model.name} has no MIG profiles")
        prof = m.mig.profile(profile)
        if prof is None:
            raise KeyError(f"{m.name} has no MIG profile {profile}")
        return prof.memory_mib


