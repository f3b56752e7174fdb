"""GPU models, MIG geometry and MIG layouts.

The default data is `packing/data/gpu_models.json` (copied from the shared GPU fact sheet, with its provenance and
"unverified" marks). Users may add or override models with a YAML file of the same entry schema. Static tables are
defaults only: whatever a node reports (labels, annotation) wins over them.

Layouts are lists of `Placement(profile, start)`; `start` is the first memory slice, and an instance occupies memory
slices `[start, start + memory_slices)` (NVML placement semantics). "Memory slices" are NVML's placement units, so
starts compare directly with what `nvidia-smi mig -lgipp` / `-lgi` print: 8 on the 7-way GPUs, 4 on A30, 12 on the
RTX PRO 6000 (a 1g instance there spans 3 units).
"""

from __future__ import annotations

import copy
import functools
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from packing.model import InputError

DATA_FILE = Path(__file__).parent / "data" / "gpu_models.json"

# Fields of the JSON / YAML schema. Unknown keys are rejected so typos in override files do not pass silently.
_MODEL_KEYS = frozenset({
    "name", "memory_mib", "memory_note", "family", "products", "variants", "pci_device_ids", "unverified", "mig",
    "sources", "notes",
})
_MIG_KEYS = frozenset({
    "compute_slices", "memory_slices", "max_instances", "max_instances_note", "balanced", "profiles", "notes",
})
_PROFILE_KEYS = frozenset({
    "name", "profile_id", "compute_slices", "memory_slices", "max_count", "allowed_starts", "memory_mib", "sm_count",
    "unverified", "notes",
})
# Vendor words that GFD product strings may or may not carry ("Tesla-T4" vs "NVIDIA-T4").
_VENDOR_TOKENS = frozenset({"NVIDIA", "TESLA"})
MIG_DISABLED_CONFIG = "all-disabled"
_DERIVED_NOTE = "memory_mib derived"  # marks profile sizes computed from the slice fraction (data file and loader)


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
    """A GFD `nvidia.com/gpu.product` value taken apart."""

    raw: str
    base: str  # without `-SHARED` / `-MIG-<profile>`
    model: GpuModel | None  # None = unknown product: use node-reported memory, treat as non-MIG
    shared: bool = False  # `-SHARED`: replicated by time-slicing / MPS and not renamed
    mig_profile: str | None = None  # `-MIG-<profile>` (single strategy); canonical name when the model knows it
    mig_invalid: bool = False  # `-MIG-INVALID`: single strategy with mixed profiles, nothing usable


@dataclass(frozen=True, order=True)
class Placement:
    """One MIG instance in a layout: profile and first memory slice."""

    profile: str
    start: int

    @property
    def ref(self) -> str:
        return f"{self.profile}@{self.start}"


def _tokens(text: str) -> tuple[str, ...]:
    parts = [t for t in re.split(r"[^0-9A-Za-z]+", text.upper()) if t]
    return tuple(t for t in parts if t not in _VENDOR_TOKENS)


class Catalog:
    """All known GPU models and the product-string index over them."""

    def __init__(self, models: Iterable[GpuModel]) -> None:
        self.models: dict[str, GpuModel] = {}
        for m in models:
            self.models[m.name] = m
        self._by_lower = {name.lower(): m for name, m in self.models.items()}
        # Exact index on the token sequence; later models (overrides) win on collisions.
        self._exact: dict[tuple[str, ...], GpuModel] = {}
        self._alias: list[tuple[frozenset[str], GpuModel]] = []
        for m in self.models.values():
            for p in (m.name, *m.products):
                toks = _tokens(p)
                if toks:
                    self._exact[toks] = m
                    self._alias.append((frozenset(toks), m))

    def get(self, name: str) -> GpuModel | None:
        return self.models.get(name) or self._by_lower.get(name.lower())

    def match_model(self, base: str) -> GpuModel | None:
        """Model for a product string without suffixes; None when unknown or ambiguous."""
        toks = _tokens(base)
        if not toks:
            return None
        exact = self._exact.get(toks)
        if exact is not None:
            return exact
        # Fallback: the model whose longest alias is wholly contained in the product's words, e.g.
        # "NVIDIA-A100-SXM4-80GB-XL" contains "A100-80GB". Ties between different models are ambiguous.
        have = set(toks)
        best_len = 0
        best: set[str] = set()
        for alias, m in self._alias:
            if alias <= have:
                if len(alias) > best_len:
                    best_len, best = len(alias), {m.name}
                elif len(alias) == best_len:
                    best.add(m.name)
        if len(best) == 1:
            return self.models[best.pop()]
        return None

    def resolve_product(self, product: str) -> ProductInfo:
        """Take a GFD product string apart: `<base>[-MIG-<profile>][-SHARED]`."""
        raw = product
        s = product.strip()
        shared = False
        suffix: str | None = None
        if s.upper().endswith("-SHARED"):
            s, shared = s[: -len("-SHARED")], True
        i = s.upper().rfind("-MIG-")
        if i >= 0:
            s, suffix = s[:i], s[i + len("-MIG-"):]
            if suffix.upper().endswith("-SHARED"):  # tolerate either suffix order
                suffix, shared = suffix[: -len("-SHARED")], True
        model = self.match_model(s)
        mig_profile: str | None = None
        invalid = False
        if suffix is not None:
            if suffix.upper() == "INVALID":
                invalid = True
            else:
                prof = model.mig.profile(suffix) if model is not None and model.mig is not None else None
                mig_profile = prof.name if prof is not None else suffix
        return ProductInfo(raw=raw, base=s, model=model, shared=shared, mig_profile=mig_profile, mig_invalid=invalid)

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


# --------------------------------------------------------------------------------------------------------------
# Loading


def _fail(file: str, where: str, problem: str) -> InputError:
    return InputError(file, where, problem)


def _int(v: Any, file: str, where: str, minimum: int = 0) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise _fail(file, where, f"must be an integer, got {v!r}")
    if v < minimum:
        raise _fail(file, where, f"must be >= {minimum}, got {v}")
    return v


def _str_list(v: Any, file: str, where: str) -> tuple[str, ...]:
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise _fail(file, where, f"must be a list of strings, got {v!r}")
    return tuple(v)


def _check_keys(d: Mapping[str, Any], allowed: frozenset[str], file: str, where: str) -> None:
    for k in d:
        if k not in allowed:
            raise _fail(file, f"{where}.{k}", f"unknown field (known: {', '.join(sorted(allowed))})")


def _parse_profile(p: Any, compute: int, total: int, model_mem: int, file: str, where: str) -> MigProfile:
    if not isinstance(p, dict):
        raise _fail(file, where, "must be a mapping")
    _check_keys(p, _PROFILE_KEYS, file, where)
    name = p.get("name")
    if not isinstance(name, str) or not name.strip():
        raise _fail(file, f"{where}.name", "must be a non-empty string")
    pid = p.get("profile_id")
    if pid is not None:
        _int(pid, file, f"{where}.profile_id")
    cs = _int(p.get("compute_slices"), file, f"{where}.compute_slices", 1)
    if cs > compute:
        raise _fail(file, f"{where}.compute_slices", f"{cs} exceeds the GPU's {compute} compute slices")
    ms = _int(p.get("memory_slices"), file, f"{where}.memory_slices", 1)
    if ms > total:
        raise _fail(file, f"{where}.memory_slices", f"{ms} exceeds the GPU's {total} memory slices")
    mc = _int(p.get("max_count", 1), file, f"{where}.max_count", 1)
    unverified = list(_str_list(p.get("unverified", []), file, f"{where}.unverified"))
    notes = p.get("notes", "")
    if not isinstance(notes, str):
        raise _fail(file, f"{where}.notes", "must be a string")
    starts_raw = p.get("allowed_starts")
    if starts_raw is None:
        # No documented placements: assume aligned starts, and say so.
        starts = tuple(range(0, total - ms + 1, ms))
        if "allowed_starts" not in unverified:
            unverified.append("allowed_starts")
    else:
        if not isinstance(starts_raw, list) or not starts_raw:
            raise _fail(file, f"{where}.allowed_starts", "must be a non-empty list of integers")
        starts = tuple(_int(s, file, f"{where}.allowed_starts[{i}]") for i, s in enumerate(starts_raw))
        for i, s in enumerate(starts):
            if s + ms > total:
                raise _fail(file, f"{where}.allowed_starts[{i}]",
                            f"start {s} + {ms} memory slices runs past the GPU's {total} slices")
        if len(set(starts)) != len(starts):
            raise _fail(file, f"{where}.allowed_starts", "contains duplicates")
        starts = tuple(sorted(starts))
    mem_raw = p.get("memory_mib")
    if mem_raw is None:
        mem = ms * model_mem // total
        if "memory_mib" not in unverified:
            unverified.append("memory_mib")
        if _DERIVED_NOTE not in notes:
            notes = "; ".join(x for x in (notes, f"{_DERIVED_NOTE}: memory_slices / total memory slices x model "
                                                 "memory_mib, rounded down") if x)
    else:
        mem = _int(mem_raw, file, f"{where}.memory_mib", 1)
    sm = p.get("sm_count")
    if sm is not None:
        _int(sm, file, f"{where}.sm_count", 1)
    return MigProfile(name=name.strip(), profile_id=pid, compute_slices=cs, memory_slices=ms, max_count=mc,
                      allowed_starts=starts, memory_mib=mem, unverified=tuple(unverified), sm_count=sm, notes=notes)


def _parse_mig(g: Any, model_mem: int, file: str, where: str) -> MigGeometry | None:
    if g is None:
        return None
    if not isinstance(g, dict):
        raise _fail(file, where, "must be a mapping or null")
    _check_keys(g, _MIG_KEYS, file, where)
    compute = _int(g.get("compute_slices"), file, f"{where}.compute_slices", 1)
    total = _int(g.get("memory_slices"), file, f"{where}.memory_slices", 1)
    max_inst = _int(g.get("max_instances", compute), file, f"{where}.max_instances", 1)
    raw_profiles = g.get("profiles")
    if not isinstance(raw_profiles, list) or not raw_profiles:
        raise _fail(file, f"{where}.profiles", "must be a non-empty list")
    profiles: dict[str, MigProfile] = {}
    for i, p in enumerate(raw_profiles):
        prof = _parse_profile(p, compute, total, model_mem, file, f"{where}.profiles[{i}]")
        if any(profile_key(prof.name) == profile_key(q) for q in profiles):
            raise _fail(file, f"{where}.profiles[{i}].name", f"duplicate profile {prof.name}")
        profiles[prof.name] = prof
    balanced: tuple[tuple[str, int], ...] | None = None
    b = g.get("balanced")
    if b is not None:
        if not isinstance(b, dict):
            raise _fail(file, f"{where}.balanced", "must be a mapping profile -> count, or null")
        items = []
        plain = MigGeometry(compute, total, max_inst, profiles)
        for pname, count in b.items():
            bprof = plain.profile(str(pname))
            if bprof is None:
                raise _fail(file, f"{where}.balanced.{pname}", "unknown profile")
            items.append((bprof.name, _int(count, file, f"{where}.balanced.{pname}", 1)))
        balanced = tuple(items)
    geometry = MigGeometry(compute, total, max_inst, profiles, balanced)
    if balanced is not None and derive_layout_geometry(geometry, dict(balanced)) is None:
        raise _fail(file, f"{where}.balanced", "these counts do not fit on one GPU")
    return geometry


def _parse_model(e: Mapping[str, Any], file: str, where: str) -> GpuModel:
    _check_keys(e, _MODEL_KEYS, file, where)
    name = e.get("name")
    if not isinstance(name, str) or not name.strip():
        raise _fail(file, f"{where}.name", "must be a non-empty string")
    mem = _int(e.get("memory_mib"), file, f"{where}.memory_mib", 1)
    family = e.get("family", "")
    if not isinstance(family, str):
        raise _fail(file, f"{where}.family", "must be a string")
    products = _str_list(e.get("products", [name]), file, f"{where}.products")
    unverified = _str_list(e.get("unverified", []), file, f"{where}.unverified")
    sources = e.get("sources", [])
    source = "; ".join(_str_list(sources, file, f"{where}.sources")) if not isinstance(sources, str) else sources
    notes = " ".join(str(e[k]) for k in ("memory_note", "notes") if e.get(k))
    mig = _parse_mig(e.get("mig"), mem, file, f"{where}.mig")
    if mig is not None:
        for pname, prof in mig.profiles.items():
            if prof.memory_mib > mem:
                raise _fail(file, f"{where}.mig.profiles[{pname}].memory_mib",
                            f"{prof.memory_mib} MiB exceeds the model's {mem} MiB")
    return GpuModel(name=name.strip(), memory_mib=mem, mig=mig, products=products, family=family,
                    unverified=unverified, source=source, notes=notes)


def _merge_entry(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """Override fields of an existing entry; MIG profiles merge by name so one profile can be corrected alone."""
    out = copy.deepcopy(base)
    for k, v in over.items():
        if k == "mig" and isinstance(v, dict) and isinstance(out.get("mig"), dict):
            mig = out["mig"]
            for mk, mv in v.items():
                if mk == "profiles" and isinstance(mv, list):
                    existing: list[Any] = mig.get("profiles", [])
                    index = {profile_key(p["name"]): i for i, p in enumerate(existing)
                             if isinstance(p, dict) and isinstance(p.get("name"), str)}
                    for p in mv:
                        pk = profile_key(p["name"]) if isinstance(p, dict) and isinstance(p.get("name"), str) else None
                        if pk is not None and pk in index:
                            existing[index[pk]] = {**existing[index[pk]], **p}
                        else:
                            existing.append(p)
                    mig["profiles"] = existing
                else:
                    mig[mk] = mv
        else:
            out[k] = copy.deepcopy(v)
    if "memory_mib" in over and isinstance(out.get("mig"), dict):
        # Profile sizes derived from the old total follow the new one, unless the override sets them itself.
        given = {profile_key(p["name"]) for p in (over.get("mig") or {}).get("profiles", [])
                 if isinstance(p, dict) and isinstance(p.get("name"), str) and p.get("memory_mib") is not None}
        for p in out["mig"].get("profiles", []):
            if (isinstance(p, dict) and _DERIVED_NOTE in str(p.get("notes", ""))
                    and profile_key(str(p.get("name"))) not in given):
                p["memory_mib"] = None
    return out


@functools.lru_cache(maxsize=1)
def _default_entries() -> tuple[dict[str, Any], ...]:
    with DATA_FILE.open(encoding="utf-8") as fh:
        doc = json.load(fh)
    return tuple(doc["models"])


@functools.cache
def default_catalog() -> Catalog:
    """The built-in catalog, loaded once (shared: do not mutate)."""
    return load_catalog()


def load_catalog(override_path: str | None = None) -> Catalog:
    """The built-in catalog, merged with a user YAML file (`models:` list of entries) when given.

    An override entry whose name matches a built-in model overrides the fields it gives (profiles merge by name;
    `mig: null` turns MIG off); other entries add models. Products listed in overrides win over built-in ones.
    Raises `InputError(file, field, problem)` for a bad file.
    """
    entries = [copy.deepcopy(e) for e in _default_entries()]
    sources = ["built-in" for _ in entries]
    if override_path is not None:
        try:
            text = Path(override_path).read_text(encoding="utf-8")
        except OSError as exc:
            raise InputError(override_path, "(file)", f"cannot read: {exc.strerror or exc}") from exc
        try:
            doc = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise InputError(override_path, "(yaml)", f"not valid YAML: {exc}") from exc
        if isinstance(doc, list):
            doc = {"models": doc}
        if not isinstance(doc, dict) or not isinstance(doc.get("models"), list):
            raise InputError(override_path, "models", "must be a list of model entries")
        for k in doc:
            if k not in ("models", "provenance"):
                raise InputError(override_path, str(k), "unknown top-level field (expected: models)")
        by_name = {str(e["name"]).lower(): i for i, e in enumerate(entries)}
        for i, over in enumerate(doc["models"]):
            where = f"models[{i}]"
            if not isinstance(over, dict):
                raise InputError(override_path, where, "must be a mapping")
            name = over.get("name")
            if not isinstance(name, str) or not name.strip():
                raise InputError(override_path, f"{where}.name", "must be a non-empty string")
            _check_keys(over, _MODEL_KEYS, override_path, where)
            j = by_name.get(name.strip().lower())
            if j is not None:
                merged = _merge_entry(entries[j], over)
                merged["name"] = entries[j]["name"]
                # Moved to the end so its products win on collisions; parsed with the file's name in errors.
                entries.pop(j)
                sources.pop(j)
                by_name = {str(e["name"]).lower(): k for k, e in enumerate(entries)}
                entries.append(merged)
            else:
                entries.append(copy.deepcopy(over))
            sources.append(f"{override_path}:{where}")
            by_name[name.strip().lower()] = len(entries) - 1
    models = []
    for i, (entry, src) in enumerate(zip(entries, sources, strict=True)):
        if src == "built-in":
            models.append(_parse_model(entry, str(DATA_FILE), f"models[{i}]"))
        else:
            file, where = src.rsplit(":", 1)
            m = _parse_model(entry, file, where)
            models.append(m if m.source else GpuModel(m.name, m.memory_mib, m.mig, m.products, m.family,
                                                      m.unverified, f"override file {file}", m.notes))
    return Catalog(models)


# --------------------------------------------------------------------------------------------------------------
# Layouts


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
    mean = [t / n_gpus for t in target]
    # Closest to the average first, so the first solution found is as even as the geometry allows.
    ordered = sorted(vectors, key=lambda v: (sum(abs(a - b) for a, b in zip(v, mean, strict=True)), v))
    geo = model.mig
    profs = [geo.profiles[n] for n in names]
    per_gpu_max = [max(v[i] for v in vectors) for i in range(len(names))]
    dead: set[tuple[tuple[int, ...], int, int]] = set()
    picked: list[tuple[int, ...]] = []

    def hopeless(rest: tuple[int, ...], gpus: int) -> bool:
        # Cheap bounds that cut impossible branches (and impossible inputs) short.
        if any(r > gpus * m for r, m in zip(rest, per_gpu_max, strict=True)):
            return True
        if sum(rest) > gpus * geo.max_instances:
            return True
        if sum(r * p.memory_slices for r, p in zip(rest, profs, strict=True)) > gpus * geo.memory_slices:
            return True
        return sum(r * p.compute_slices for r, p in zip(rest, profs, strict=True)) > gpus * geo.compute_slices

    def search(rest: tuple[int, ...], gpus: int, first: int) -> bool:
        if gpus == 0:
            return not any(rest)
        key = (rest, gpus, first)
        if key in dead or hopeless(rest, gpus):
            return False
        for k in range(first, len(ordered)):
            v = ordered[k]
            if any(a > b for a, b in zip(v, rest, strict=True)):
                continue
            picked.append(v)
            # Vectors are taken in non-decreasing list order: each multiset of GPUs is tried once.
            if search(tuple(b - a for a, b in zip(v, rest, strict=True)), gpus - 1, k):
                return True
            picked.pop()
        dead.add(key)
        return False

    if not search(target, n_gpus, 0):
        return None
    out: list[list[Placement]] = []
    for v in picked:
        layout = derive_layout(model, {n: c for n, c in zip(names, v, strict=True) if c})
        assert layout is not None  # every vector comes from a valid layout
        out.append(layout)
    return out
