"""Loading the catalog: the default data `packing/data/gpu_models.json` (copied from the shared GPU fact sheet,
with its provenance and "unverified" marks), merged with a user's YAML override file of the same entry schema.
Static tables are defaults only: whatever a node reports (labels, annotation) wins over them.
"""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from packing.catalog.mig_layout import derive_layout_geometry
from packing.catalog.types import Catalog, GpuModel, MigGeometry, MigProfile, profile_key
from packing.model import InputError

_DERIVED_NOTE = "memory_mib derived"  # marks profile sizes computed from the slice fraction (data file and loader)
DATA_FILE = Path(__file__).parent.parent / "data" / "gpu_models.json"

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
    starts = _profile_starts(p.get("allowed_starts"), ms, total, unverified, file, where)
    mem, notes = _profile_memory(p.get("memory_mib"), ms, total, model_mem, unverified, notes, file, where)
    sm = p.get("sm_count")
    if sm is not None:
        _int(sm, file, f"{where}.sm_count", 1)
    return MigProfile(name=name.strip(), profile_id=pid, compute_slices=cs, memory_slices=ms, max_count=mc,
                      allowed_starts=starts, memory_mib=mem, unverified=tuple(unverified), sm_count=sm, notes=notes)


def _profile_starts(raw: Any, ms: int, total: int, unverified: list[str], file: str, where: str) -> tuple[int, ...]:
    """A profile's allowed start slices, sorted; none documented: aligned starts, marked unverified."""
    if raw is None:
        if "allowed_starts" not in unverified:
            unverified.append("allowed_starts")
        return tuple(range(0, total - ms + 1, ms))
    if not isinstance(raw, list) or not raw:
        raise _fail(file, f"{where}.allowed_starts", "must be a non-empty list of integers")
    starts = tuple(_int(s, file, f"{where}.allowed_starts[{i}]") for i, s in enumerate(raw))
    for i, s in enumerate(starts):
        if s + ms > total:
            raise _fail(file, f"{where}.allowed_starts[{i}]",
                        f"start {s} + {ms} memory slices runs past the GPU's {total} slices")
    if len(set(starts)) != len(starts):
        raise _fail(file, f"{where}.allowed_starts", "contains duplicates")
    return tuple(sorted(starts))


def _profile_memory(raw: Any, ms: int, total: int, model_mem: int, unverified: list[str], notes: str, file: str,
                    where: str) -> tuple[int, str]:
    """A profile's memory and its notes; none given: its share of the model's memory, marked unverified and
    noted as derived."""
    if raw is not None:
        return _int(raw, file, f"{where}.memory_mib", 1), notes
    if "memory_mib" not in unverified:
        unverified.append("memory_mib")
    if _DERIVED_NOTE not in notes:
        notes = "; ".join(x for x in (notes, f"{_DERIVED_NOTE}: memory_slices / total memory slices x model "
                                             "memory_mib, rounded down") if x)
    return ms * model_mem // total, notes


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
        _apply_overrides(entries, sources, _override_models(override_path), override_path)
    return Catalog([_parse_source(entry, src, i) for i, (entry, src) in enumerate(zip(entries, sources, strict=True))])


def _override_models(path: str) -> list[Any]:
    """The `models` list of a user override file; raises InputError for a file that is unreadable or misshapen."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(path, "(file)", f"cannot read: {exc.strerror or exc}") from exc
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise InputError(path, "(yaml)", f"not valid YAML: {exc}") from exc
    if isinstance(doc, list):
        doc = {"models": doc}
    if not isinstance(doc, dict) or not isinstance(doc.get("models"), list):
        raise InputError(path, "models", "must be a list of model entries")
    for k in doc:
        if k not in ("models", "provenance"):
            raise InputError(path, str(k), "unknown top-level field (expected: models)")
    return doc["models"]


def _apply_overrides(entries: list[Any], sources: list[str], overrides: list[Any], path: str) -> None:
    """Merge override entries into `entries` (and their `sources`) in place: a model named again is merged and
    moved to the end, a new one appended."""
    by_name = {str(e["name"]).lower(): i for i, e in enumerate(entries)}
    for i, over in enumerate(overrides):
        where = f"models[{i}]"
        if not isinstance(over, dict):
            raise InputError(path, where, "must be a mapping")
        name = over.get("name")
        if not isinstance(name, str) or not name.strip():
            raise InputError(path, f"{where}.name", "must be a non-empty string")
        _check_keys(over, _MODEL_KEYS, path, where)
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
        sources.append(f"{path}:{where}")
        by_name[name.strip().lower()] = len(entries) - 1


def _parse_source(entry: Any, src: str, i: int) -> GpuModel:
    """One catalog entry parsed, its errors naming where it came from (the built-in file or an override)."""
    if src == "built-in":
        return _parse_model(entry, str(DATA_FILE), f"models[{i}]")
    file, where = src.rsplit(":", 1)
    m = _parse_model(entry, file, where)
    return m if m.source else GpuModel(m.name, m.memory_mib, m.mig, m.products, m.family,
                                       m.unverified, f"override file {file}", m.notes)
