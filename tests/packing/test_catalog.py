"""GPU catalog: data integrity, product mapping, overrides and MIG layouts."""

from __future__ import annotations

import functools
import json
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from packing.catalog import (
    DATA_FILE,
    Catalog,
    GpuModel,
    MigGeometry,
    MigProfile,
    Placement,
    all_layouts,
    derive_layout,
    distribute_counts,
    load_catalog,
    named_layout,
    validate_layout,
)
from packing.model import InputError
from packing.vendors.nvidia import NVIDIA

CAT = load_catalog()
MIG_MODELS = sorted(name for name, m in CAT.models.items() if m.mig is not None)


def model(name: str) -> GpuModel:
    m = CAT.get(name)
    assert m is not None, name
    return m


def counts_of(layout: list[Placement] | tuple[Placement, ...]) -> Counter[str]:
    return Counter(p.profile for p in layout)


# --- data -------------------------------------------------------------------------------------------------------


def test_data_file_has_provenance_and_unverified_marks() -> None:
    doc = json.loads(DATA_FILE.read_text())
    prov = doc["provenance"]
    assert any("gpu-facts.md" in s for s in prov["copied_from"])
    assert any("mig-profiles.json" in s for s in prov["copied_from"])
    assert any("mig-published.md" in s for s in prov["copied_from"])
    assert prov["corrections"] and all(isinstance(c, str) and " -> " in c for c in prov["corrections"])
    a100_80 = next(e for e in doc["models"] if e["name"] == "A100-80GB")
    # The A100-80GB placements are still inferred (no -lgipp labelled A100-80GB found): that mark must survive.
    # Its MiB now come from real -lgip output, so memory_mib is no longer marked.
    assert a100_80["mig"]["profiles"][0]["unverified"] == ["allowed_starts"]
    h100 = next(e for e in doc["models"] if e["name"] == "H100-80GB")
    assert h100["mig"]["profiles"][0]["unverified"] == []
    # Nothing was found for H100-96GB / PG506 / H20 (only GH200 96GB): the entry stays unverified.
    h100_96 = next(e for e in doc["models"] if e["name"] == "H100-96GB")
    assert "entry" in h100_96["unverified"]


def test_known_memory_figures() -> None:
    assert model("A100-80GB").memory_mib == 81920
    assert "memory_mib" not in model("A100-80GB").unverified
    assert model("H100-NVL-94GB").memory_mib == 95830
    assert model("T4").memory_mib == 15360
    assert "memory_mib" in model("L4").unverified
    assert model("L40S").memory_mib == 48 * 1024
    h100 = model("H100-80GB")
    # 39.25 GiB / a 40192 MiB device on driver R525, 40448 on 570/580: the smaller is kept.
    assert h100.mig is not None and h100.mig.profiles["3g.40gb"].memory_mib == 40192


def test_null_profile_memory_is_derived_and_marked() -> None:
    b200 = model("B200-180GB")
    assert b200.mig is not None
    p = b200.mig.profiles["3g.90gb"]
    assert p.memory_mib == 4 * b200.memory_mib // 8
    assert "memory_mib" in p.unverified
    # No source lists RTX PRO 5000 placements: aligned starts, marked (the RTX PRO 6000 ones are now read from -lgipp).
    rtx = model("RTX-PRO-5000-Blackwell-48GB")
    assert rtx.mig is not None
    assert rtx.mig.profiles["2g.24gb-me"].allowed_starts == (0, 2)
    assert "allowed_starts" in rtx.mig.profiles["2g.24gb-me"].unverified


@pytest.mark.parametrize("name", ["P100-16GB", "V100-16GB", "V100-32GB", "T4", "A10", "A10G", "A16", "A40",
                                  "RTX-A6000", "L4", "L40", "L40S", "RTX-6000-Ada"])
def test_non_mig_models(name: str) -> None:
    m = model(name)
    assert m.mig is None and m.memory_mib > 0


def test_every_mig_profile_fits_its_gpu() -> None:
    for name in MIG_MODELS:
        m = model(name)
        assert m.mig is not None
        for p in m.mig.profiles.values():
            assert p.memory_mib <= m.memory_mib
            assert all(0 <= s and s + p.memory_slices <= m.mig.memory_slices for s in p.allowed_starts)
            assert derive_layout(m, {p.name: 1}) == [Placement(p.name, p.allowed_starts[0])]


# --- published figures (shared/reference/mig-published.md): never more memory than the hardware has ---------------


@pytest.mark.parametrize("name", MIG_MODELS)
def test_no_mig_profile_exceeds_its_model_memory(name: str) -> None:
    m = model(name)
    assert m.mig is not None
    for p in m.mig.profiles.values():
        assert p.memory_mib <= m.memory_mib, (p.name, p.memory_mib, m.memory_mib)
    # Nor does any whole-GPU layout add up to more than the card.
    for layout in all_layouts(m):
        used = sum(m.mig.profiles[pl.profile].memory_mib for pl in layout)
        assert used <= m.memory_mib, (layout, used, m.memory_mib)


@pytest.mark.parametrize("name", MIG_MODELS)
def test_full_profile_does_not_exceed_model_total(name: str) -> None:
    m = model(name)
    assert m.mig is not None
    full = [p for p in m.mig.profiles.values() if p.memory_slices == m.mig.memory_slices]
    assert full, "every MIG model has a full-GPU (7g / 4g) profile"
    for p in full:
        assert p.compute_slices == m.mig.compute_slices
        assert p.memory_mib <= m.memory_mib
        if "memory_mib" not in p.unverified and "memory_mib" not in m.unverified and "entry" not in m.unverified:
            # Measured on both sides: the full instance is always below the card total (ECC / reserved memory).
            assert p.memory_mib < m.memory_mib, (p.name, p.memory_mib, m.memory_mib)


@pytest.mark.parametrize(("name", "profile", "mib"), [
    ("A100-40GB", None, 40537),
    ("A100-40GB", "1g.10gb", 9856),
    ("A100-40GB", "7g.40gb", 40192),
    ("A100-80GB", None, 81920),
    ("A100-80GB", "1g.10gb", 9728),
    ("A100-80GB", "1g.10gb+me", 9728),
    ("A100-80GB", "1g.20gb", 19968),
    ("A100-80GB", "3g.40gb", 40192),
    ("A100-80GB", "7g.80gb", 80896),
    ("H100-80GB", None, 81559),
    ("H100-80GB", "1g.10gb", 9856),
    ("H100-80GB", "1g.20gb", 19968),
    ("H100-80GB", "4g.40gb", 40192),
    ("H100-80GB", "7g.80gb", 81152),
    ("H100-NVL-94GB", "7g.94gb", 95360),
    ("H100-96GB", None, 97871),
    ("H100-96GB", "1g.12gb", 11264),
    ("H100-96GB", "1g.12gb+me", 11264),
    ("H100-96GB", "1g.24gb", 23552),
    ("H100-96GB", "2g.24gb", 23552),
    ("H100-96GB", "3g.48gb", 47616),
    ("H100-96GB", "4g.48gb", 47616),
    ("H100-96GB", "7g.96gb", 95232),
    ("H200-141GB", None, 143771),
    ("H200-141GB", "7g.141gb", 143104),
    ("B200-180GB", None, 183359),
    ("B200-180GB", "1g.23gb", 20992),
    ("A30-24GB", None, 24576),
    ("A30-24GB", "1g.6gb", 5952),
    ("A30-24GB", "2g.12gb+me", 11968),
    ("A30-24GB", "4g.24gb", 24000),
    ("RTX-PRO-6000-Blackwell-96GB", None, 97887),
    ("RTX-PRO-6000-Blackwell-96GB", "1g.24gb", 23680),
    ("RTX-PRO-6000-Blackwell-96GB", "1g.24gb-me", 23680),
    ("RTX-PRO-6000-Blackwell-96GB", "2g.48gb", 47616),
    ("RTX-PRO-6000-Blackwell-96GB", "4g.96gb", 97408),
])
def test_published_memory_figures(name: str, profile: str | None, mib: int) -> None:
    m = model(name)
    if profile is None:
        assert m.memory_mib == mib
        assert "memory_mib" not in m.unverified
    else:
        assert m.mig is not None
        p = m.mig.profiles[profile]
        assert p.memory_mib == mib
        assert "memory_mib" not in p.unverified
        assert "memory_mib derived" not in p.notes


def test_derived_sizes_follow_the_corrected_total() -> None:
    b200 = model("B200-180GB")
    assert b200.mig is not None
    assert b200.mig.profiles["7g.180gb"].memory_mib == b200.memory_mib == 183359
    assert b200.mig.profiles["4g.90gb"].memory_mib == 4 * 183359 // 8
    assert "memory_mib" in b200.mig.profiles["7g.180gb"].unverified


def test_h100_sm_counts_are_the_smaller_pcie_figures() -> None:
    h100 = model("H100-80GB")
    assert h100.mig is not None
    sms = {n: p.sm_count for n, p in h100.mig.profiles.items()}
    assert sms == {"1g.10gb": 14, "1g.10gb+me": 14, "1g.20gb": 14, "2g.20gb": 30, "3g.40gb": 46, "4g.40gb": 62,
                   "7g.80gb": 114}
    assert "132" in h100.mig.profiles["7g.80gb"].notes  # the SXM5 figure is kept in the notes


def test_published_profile_ids_and_sms() -> None:
    a30 = model("A30-24GB")
    assert a30.mig is not None
    assert {n: (p.profile_id, p.sm_count) for n, p in a30.mig.profiles.items()} == {
        "1g.6gb": (14, 14), "1g.6gb+me": (21, 14), "2g.12gb": (5, 28), "2g.12gb+me": (6, 28), "4g.24gb": (0, 56)}
    assert all(p.unverified == () for p in a30.mig.profiles.values())
    h200 = model("H200-141GB")
    assert h200.mig is not None and h200.mig.profiles["7g.141gb"].sm_count == 132
    gh = model("H100-96GB")
    assert gh.mig is not None
    assert [p.sm_count for p in gh.mig.profiles.values()] == [16, 16, 26, 32, 60, 64, 132]


def test_rtx_pro_6000_uses_the_12_unit_nvml_grid() -> None:
    rtx = model("RTX-PRO-6000-Blackwell-96GB")
    geo = rtx.mig
    assert geo is not None
    assert (geo.compute_slices, geo.memory_slices, geo.max_instances) == (4, 12, 4)
    ids = {n: p.profile_id for n, p in geo.profiles.items()}
    assert ids == {"1g.24gb": 14, "1g.24gb+me": 21, "1g.24gb+gfx": 47, "1g.24gb+me.all": 65, "1g.24gb-me": 67,
                   "2g.48gb": 5, "2g.48gb+gfx": 35, "2g.48gb+me.all": 64, "2g.48gb-me": 66,
                   "4g.96gb": 0, "4g.96gb+gfx": 32}
    for p in geo.profiles.values():
        size = p.compute_slices  # 1g / 2g / 4g
        assert (p.memory_slices, p.allowed_starts) == {1: (3, (0, 3, 6, 9)), 2: (6, (0, 6)), 4: (12, (0,))}[size]
        assert p.sm_count == {1: 46, 2: 94, 4: 188}[size]
        assert p.unverified == ()
    # nvidia-smi mig -lgi on that card: 2g.48gb at 0:6, 1g.24gb at 6:3 and 9:3.
    assert validate_layout(rtx, [Placement("2g.48gb", 0), Placement("1g.24gb", 6), Placement("1g.24gb", 9)]) == []
    assert validate_layout(rtx, [Placement("1g.24gb", s) for s in (0, 3, 6, 9)]) == []
    assert validate_layout(rtx, [Placement("2g.48gb", 3)])  # not a 2g start
    assert validate_layout(rtx, [Placement("1g.24gb", 1)])  # starts are multiples of 3
    assert validate_layout(rtx, [Placement("1g.24gb", 3), Placement("2g.48gb", 0)])  # overlap on units 3-5
    assert named_layout(rtx, "all-1g.24gb") == [Placement("1g.24gb", s) for s in (0, 3, 6, 9)]
    bal = named_layout(rtx, "all-balanced")
    assert bal is not None and counts_of(bal) == {"1g.24gb": 2, "2g.48gb": 1} and validate_layout(rtx, bal) == []
    assert max(len(layout) for layout in all_layouts(rtx)) == 4
    two = distribute_counts(rtx, 2, {"2g.48gb": 2, "1g.24gb": 4})
    assert two is not None and all(validate_layout(rtx, g) == [] for g in two)


# --- products ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("product", "expected"), [
    ("NVIDIA-A100-SXM4-80GB", "A100-80GB"),
    ("NVIDIA-A100-PCIE-40GB", "A100-40GB"),
    ("NVIDIA-A100-80GB-PCIe", "A100-80GB"),
    ("NVIDIA-H100-80GB-HBM3", "H100-80GB"),
    ("NVIDIA-H100-NVL", "H100-NVL-94GB"),
    ("NVIDIA-H200", "H200-141GB"),
    ("Tesla-T4", "T4"),
    ("tesla-t4", "T4"),
    ("Tesla-V100-SXM2-16GB", "V100-16GB"),
    ("Tesla-V100-PCIE-32GB", "V100-32GB"),
    ("NVIDIA-L4", "L4"),
    ("NVIDIA-L40S", "L40S"),
    ("NVIDIA-L40", "L40"),
    ("NVIDIA-A10", "A10"),
    ("NVIDIA-A10G", "A10G"),
    ("NVIDIA-RTX-6000-Ada-Generation", "RTX-6000-Ada"),
    ("NVIDIA A100-SXM4-80GB", "A100-80GB"),  # an NVML name before GFD's rewriting
    ("NVIDIA-A100-SXM4-80GB-Rev2", "A100-80GB"),  # unseen variant: alias words contained
])
def test_product_mapping(product: str, expected: str) -> None:
    info = NVIDIA.resolve_product(CAT, product)
    assert info.model is not None and info.model.name == expected
    assert not info.shared and info.mig_profile is None


def test_product_shared_suffix() -> None:
    info = NVIDIA.resolve_product(CAT, "Tesla-T4-SHARED")
    assert info.base == "Tesla-T4" and info.shared and info.model is not None and info.model.name == "T4"


def test_product_mig_single_suffix() -> None:
    info = NVIDIA.resolve_product(CAT, "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb")
    assert info.base == "NVIDIA-A100-SXM4-40GB"
    assert info.model is not None and info.model.name == "A100-40GB"
    assert info.mig_profile == "1g.5gb" and not info.shared
    me = NVIDIA.resolve_product(CAT, "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb.me-SHARED")
    assert me.mig_profile == "1g.10gb+me" and me.shared
    bad = NVIDIA.resolve_product(CAT, "NVIDIA-A100-SXM4-80GB-MIG-INVALID")
    assert bad.mig_invalid and bad.mig_profile is None


@pytest.mark.parametrize("product", ["NVIDIA-Foo-9000", "NVIDIA-A100-SXM4", "", "NVIDIA-H100-94GB"])
def test_unknown_or_ambiguous_product(product: str) -> None:
    assert NVIDIA.resolve_product(CAT, product).model is None


def test_profile_memory_node_value_wins() -> None:
    a = model("A100-80GB")
    assert CAT.profile_memory(a, "3g.40gb", None) == 40192
    assert CAT.profile_memory("A100-80GB", "3g.40gb", 40448) == 40448
    assert CAT.profile_memory(a, "1g.10gb.me", None) == 9728
    with pytest.raises(KeyError):
        CAT.profile_memory(a, "9g.1tb", None)


# --- overrides --------------------------------------------------------------------------------------------------


def write(tmp_path: Path, text: str) -> str:
    p = tmp_path / "gpus.yaml"
    p.write_text(text)
    return str(p)


def test_override_adds_and_changes_models(tmp_path: Path) -> None:
    path = write(tmp_path, """
models:
  - name: MyGPU-40GB
    memory_mib: 40000
    family: custom
    products: [ACME-MyGPU-40GB]
  - name: T4
    memory_mib: 15000
  - name: A100-80GB
    mig:
      profiles:
        - name: 3g.40gb
          memory_mib: 40448
""")
    cat = load_catalog(path)
    mine = NVIDIA.resolve_product(cat, "ACME-MyGPU-40GB-SHARED")
    assert mine.model is not None and mine.model.memory_mib == 40000 and mine.shared
    assert mine.model.source.startswith("override file")
    t4 = cat.get("T4")
    assert t4 is not None and t4.memory_mib == 15000
    assert NVIDIA.resolve_product(cat, "Tesla-T4").model == t4  # products kept from the built-in entry
    a = cat.get("A100-80GB")
    assert a is not None and a.mig is not None
    assert a.mig.profiles["3g.40gb"].memory_mib == 40448
    assert a.mig.profiles["1g.10gb"].memory_mib == 9728  # other profiles untouched
    assert CAT.get("T4").memory_mib == 15360  # type: ignore[union-attr]  # the default catalog is not mutated


def test_override_memory_rederives_derived_profiles(tmp_path: Path) -> None:
    # A real NVML total below the nominal 144 GiB must not clash with profile sizes derived from the nominal one.
    path = write(tmp_path, "models:\n  - name: GH200-144GB\n    memory_mib: 146000\n"
                           "  - name: H200-141GB\n    memory_mib: 143500\n")
    cat = load_catalog(path)
    gh = cat.get("GH200-144GB")
    assert gh is not None and gh.mig is not None and gh.memory_mib == 146000
    assert gh.mig.profiles["7g.144gb"].memory_mib == 146000
    assert gh.mig.profiles["3g.72gb"].memory_mib == 73000
    assert "memory_mib" in gh.mig.profiles["7g.144gb"].unverified
    assert gh.mig.profiles["1g.18gb"].memory_mib == 17920  # from real -lgip output: kept
    # Sizes read from real output do not follow a new total.
    h200 = cat.get("H200-141GB")
    assert h200 is not None and h200.mig is not None and h200.memory_mib == 143500
    assert h200.mig.profiles["7g.141gb"].memory_mib == 143104
    assert h200.mig.profiles["3g.71gb"].memory_mib == 71168


def test_override_new_mig_model_derives_missing_values(tmp_path: Path) -> None:
    path = write(tmp_path, """
models:
  - name: Quad
    memory_mib: 32768
    mig:
      compute_slices: 4
      memory_slices: 4
      max_instances: 4
      profiles:
        - {name: 1g.8gb, compute_slices: 1, memory_slices: 1, max_count: 4}
        - {name: 2g.16gb, compute_slices: 2, memory_slices: 2, max_count: 2, allowed_starts: [0, 2], memory_mib: 16000}
""")
    q = load_catalog(path).get("Quad")
    assert q is not None and q.mig is not None
    one = q.mig.profiles["1g.8gb"]
    assert one.allowed_starts == (0, 1, 2, 3) and one.memory_mib == 8192
    assert {"allowed_starts", "memory_mib"} <= set(one.unverified)
    assert derive_layout(q, {"1g.8gb": 2, "2g.16gb": 1}) is not None


@pytest.mark.parametrize(("text", "field"), [
    ("models:\n  - name: X\n", "models[0].memory_mib"),
    ("models:\n  - name: X\n    memory_mib: -5\n", "models[0].memory_mib"),
    ("models:\n  - name: X\n    memory_mib: 100\n    colour: red\n", "models[0].colour"),
    ("models:\n  - memory_mib: 100\n", "models[0].name"),
    ("models:\n  - name: X\n    memory_mib: 100\n    products: Tesla-X\n", "models[0].products"),
    ("models:\n  - name: X\n    memory_mib: 100\n    mig:\n      compute_slices: 7\n      memory_slices: 8\n"
     "      profiles:\n        - {name: 1g, compute_slices: 1, memory_slices: 1, allowed_starts: [7, 8]}\n",
     "models[0].mig.profiles[0].allowed_starts[1]"),
    ("models:\n  - name: X\n    memory_mib: 100\n    mig:\n      compute_slices: 7\n      memory_slices: 8\n"
     "      profiles:\n        - {name: 1g, compute_slices: 9, memory_slices: 1}\n",
     "models[0].mig.profiles[0].compute_slices"),
    ("models:\n  - name: A100-80GB\n    mig:\n      profiles:\n        - name: 3g.40gb\n          max_count: zero\n",
     "models[0].mig.profiles[4].max_count"),
    ("models: 5\n", "models"),
    ("models: [\n", "(yaml)"),
])
def test_bad_override_names_the_field(tmp_path: Path, text: str, field: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(InputError) as err:
        load_catalog(path)
    assert err.value.field_name == field
    assert err.value.obj.endswith("gpus.yaml")


def test_missing_override_file(tmp_path: Path) -> None:
    with pytest.raises(InputError) as err:
        load_catalog(str(tmp_path / "nope.yaml"))
    assert err.value.field_name == "(file)"


# --- layouts ----------------------------------------------------------------------------------------------------


def test_validate_layout_accepts_balanced() -> None:
    a = model("A100-80GB")
    assert validate_layout(a, [Placement("3g.40gb", 4), Placement("2g.20gb", 0), Placement("1g.10gb", 2),
                               Placement("1g.10gb", 3)]) == []


def test_validate_layout_rejects_overlap() -> None:
    msgs = validate_layout(model("A100-80GB"), [Placement("3g.40gb", 0), Placement("2g.20gb", 2)])
    assert any("instance 1 (2g.20gb@2) overlaps instance 0 (3g.40gb@0)" in m for m in msgs)


def test_validate_layout_rejects_bad_start() -> None:
    msgs = validate_layout(model("A100-80GB"), [Placement("3g.40gb", 2)])
    assert msgs and "instance 0 (3g.40gb@2)" in msgs[0] and "allowed: 0, 4" in msgs[0]
    assert validate_layout(model("A100-80GB"), [Placement("1g.10gb", 7)])  # slice 7 is not a 1g start


def test_validate_layout_rejects_compute_overflow() -> None:
    # Memory fits (2 of 4 slices) but compute does not (4 of 3); no real 7/8 GPU shows this with valid starts.
    prof = MigProfile("2g.1gb", None, 2, 1, 4, (0, 1, 2, 3), 1024)
    fat = GpuModel("Fat", 4096, MigGeometry(3, 4, 4, {"2g.1gb": prof}), ("ACME-Fat",))
    assert validate_layout(fat, [Placement("2g.1gb", 0)]) == []
    assert validate_layout(fat, [Placement("2g.1gb", 0), Placement("2g.1gb", 1)]) == [
        "layout uses 4 compute slices, the GPU has 3"]
    assert derive_layout(fat, {"2g.1gb": 2}) is None
    assert sorted(all_layouts(fat)) == [(), *[(Placement("2g.1gb", s),) for s in range(4)]]


def test_validate_layout_rejects_counts_unknown_and_non_mig() -> None:
    a = model("A100-80GB")
    msgs = validate_layout(a, [Placement("1g.10gb+me", 0), Placement("1g.10gb+me", 1)])
    assert any("instance 1" in m and "more than 1" in m for m in msgs)
    assert any("no MIG profile" in m for m in validate_layout(a, [Placement("1g.5gb", 0)]))
    assert validate_layout(model("T4"), [Placement("1g.5gb", 0)]) == ["T4 does not support MIG"]
    assert validate_layout(model("T4"), []) == []


def test_named_layouts() -> None:
    a = model("A100-80GB")
    assert named_layout(a, "all-disabled") is None
    assert named_layout(a, "all-enabled") == []
    assert counts_of(named_layout(a, "all-1g.10gb") or []) == {"1g.10gb": 7}
    assert counts_of(named_layout(a, "all-1g.20gb") or []) == {"1g.20gb": 4}
    assert counts_of(named_layout(a, "all-2g.20gb") or []) == {"2g.20gb": 3}
    assert counts_of(named_layout(a, "all-3g.40gb") or []) == {"3g.40gb": 2}
    assert counts_of(named_layout(a, "all-7g.80gb") or []) == {"7g.80gb": 1}
    assert counts_of(named_layout(a, "all-1g.10gb.me") or []) == {"1g.10gb+me": 1}
    bal = named_layout(a, "all-balanced")
    assert bal is not None and counts_of(bal) == {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}
    assert validate_layout(a, bal) == []
    with pytest.raises(ValueError):
        named_layout(a, "custom-config")
    with pytest.raises(ValueError):
        named_layout(a, "all-1g.5gb")


@pytest.mark.parametrize("name", MIG_MODELS)
def test_named_layouts_valid_for_every_model(name: str) -> None:
    m = model(name)
    assert m.mig is not None
    if m.mig.balanced is not None:
        bal = named_layout(m, "all-balanced")
        assert bal is not None and validate_layout(m, bal) == []
    for p in m.mig.profiles:
        layout = named_layout(m, "all-" + p.replace("+", "."))
        assert layout and validate_layout(m, layout) == []


def test_derive_layout_impossible() -> None:
    a = model("A100-80GB")
    assert derive_layout(a, {"3g.40gb": 3}) is None
    assert derive_layout(a, {"1g.10gb": 7, "1g.20gb": 1}) is None  # compute 8
    assert derive_layout(a, {"4g.40gb": 1, "3g.40gb": 1}) is not None  # allowed since R510
    assert derive_layout(a, {}) == []
    with pytest.raises(ValueError):
        derive_layout(a, {"9g.1tb": 1})


@pytest.mark.parametrize("name", MIG_MODELS)
def test_all_layouts_are_valid_and_distinct(name: str) -> None:
    m = model(name)
    layouts = all_layouts(m)
    assert () in layouts
    assert len({frozenset(layout) for layout in layouts}) == len(layouts)
    for layout in layouts:
        assert validate_layout(m, layout) == [], layout
    # Every layout's counts can be derived again (derive_layout finds some placement for it).
    seen = {tuple(sorted(counts_of(layout).items())) for layout in layouts}
    for c in seen:
        assert derive_layout(m, dict(c)) is not None


def test_all_layouts_seven_way_matches_known_maxima() -> None:
    layouts = all_layouts(model("H100-80GB"))
    assert max(len(layout) for layout in layouts) == 7
    assert any(counts_of(layout) == {"4g.40gb": 1, "3g.40gb": 1} for layout in layouts)


def test_distribute_counts_example_a() -> None:
    a = model("A100-80GB")
    gpus = distribute_counts(a, 8, {"1g.10gb": 16, "2g.20gb": 8, "3g.40gb": 8})
    assert gpus is not None and len(gpus) == 8
    assert all(counts_of(g) == {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1} for g in gpus)


def test_distribute_counts_uneven_and_impossible() -> None:
    a = model("A100-80GB")
    gpus = distribute_counts(a, 3, {"3g.40gb": 3, "1g.10gb": 5})
    assert gpus is not None and len(gpus) == 3
    assert sum((counts_of(g) for g in gpus), Counter()) == {"3g.40gb": 3, "1g.10gb": 5}
    assert all(validate_layout(a, g) == [] for g in gpus)
    assert distribute_counts(a, 2, {"3g.40gb": 5}) is None
    assert distribute_counts(a, 8, {"1g.10gb": 57}) is None
    assert distribute_counts(a, 0, {}) == []
    assert distribute_counts(a, 2, {}) == [[], []]


@st.composite
def node_mig_counts(draw: st.DrawFn) -> tuple[GpuModel, int, dict[str, int]]:
    """A MIG model, a GPU count, and node-wide instance counts taken from random valid layouts."""
    m = model(draw(st.sampled_from(MIG_MODELS)))
    layouts = all_layouts(m)
    n = draw(st.integers(min_value=1, max_value=8))
    total: Counter[str] = Counter()
    for _ in range(n):
        total += counts_of(layouts[draw(st.integers(min_value=0, max_value=len(layouts) - 1))])
    return m, n, dict(total)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(node_mig_counts())
def test_label_derived_layouts_are_valid_for_every_mig_model(case: tuple[GpuModel, int, dict[str, int]]) -> None:
    m, n, counts = case
    gpus = distribute_counts(m, n, counts)
    assert gpus is not None, (m.name, n, counts)
    assert len(gpus) == n
    for g in gpus:
        assert validate_layout(m, g) == []
    assert sum((counts_of(g) for g in gpus), Counter()) == Counter(counts)
    if n == 1:
        one = derive_layout(m, counts)
        assert one is not None and validate_layout(m, one) == []


@functools.cache
def valid_sets(name: str) -> frozenset[frozenset[Placement]]:
    return frozenset(frozenset(layout) for layout in all_layouts(model(name)))


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(MIG_MODELS), st.data())
def test_validate_layout_agrees_with_enumeration(name: str, data: st.DataObject) -> None:
    """A random set of placements is valid exactly when it is one of all_layouts."""
    m = model(name)
    assert m.mig is not None
    options = [Placement(p.name, s) for p in m.mig.profiles.values() for s in p.allowed_starts]
    chosen = data.draw(st.lists(st.sampled_from(options), max_size=5, unique=True))
    assert (validate_layout(m, chosen) == []) == (frozenset(chosen) in valid_sets(name))


def test_catalog_from_models_directly() -> None:
    c = Catalog([GpuModel("Tiny", 1024, None, ("ACME-Tiny",))])
    assert c.match_model("ACME-Tiny") is not None
    assert c.match_model("Tesla-T4") is None
