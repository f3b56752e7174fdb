"""nodeagent.nvml / nodeagent.inventory on a stand-in NVML, and scripts/nvml_check.py's parsing."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest
from fakes.pynvml_fake import (
    A100_80GB_PROFILES,
    NVML_ERROR_DRIVER_NOT_LOADED,
    NVML_ERROR_UNKNOWN,
    FakeGpu,
    FakeMig,
    FakeNvml,
)

from nodeagent.config import AgentConfig
from nodeagent.inventory import (
    FileInventory,
    InventoryError,
    NvmlInventory,
    health_report,
    to_annotation,
    validate_annotation,
)
from nodeagent.nvml import (
    NvmlReader,
    NvmlUnavailable,
    gfd_product,
    mig_memory_gb,
    mig_profile_name,
    read_gpus,
)
from packing.catalog import default_catalog
from packing.k8s.inventory import GPUS_ANNOTATION, node_from_k8s
from packing.model import Mode
from packing.vendors.base import GpuReader, GpuReaderUnavailable, RawGpu

ROOT = Path(__file__).resolve().parents[2]
NODE = "gpu-node-1"
A100 = "GPU-a100-0000-0000-0000-000000000000"
H100 = "GPU-h100-1111-1111-1111-111111111111"
T4 = "GPU-t4-2222-2222-2222-222222222222"
MIG_3G, MIG_2G, MIG_1G = "MIG-3g-aaaa", "MIG-2g-bbbb", "MIG-1g-cccc"

# NVML functions the agent may call: queries only. Anything else reaching the fake fails (AttributeError).
READ_ONLY_CALLS = {
    "nvmlInit", "nvmlShutdown", "nvmlDeviceGetCount", "nvmlDeviceGetHandleByIndex", "nvmlDeviceGetUUID",
    "nvmlDeviceGetName", "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetCudaComputeCapability", "nvmlDeviceGetMigMode",
    "nvmlDeviceGetMaxMigDeviceCount", "nvmlDeviceGetMigDeviceHandleByIndex", "nvmlDeviceGetGpuInstanceId",
    "nvmlDeviceGetGpuInstanceById", "nvmlGpuInstanceGetInfo", "nvmlDeviceGetGpuInstanceProfileInfo",
}
# NVML calls that change state: setters, MIG instance creation/destruction, resets, clears, event/regs.
WRITING_NVML = re.compile(r"\bnvml\w*?(Set|Create|Destroy|Reset|Clear|Register|Modify|Enable|Disable|Freeze)"
                          r"\w*\s*\(")


def a100_mig() -> FakeGpu:
    # Slots 0, 2 and 5 are used, the others are empty (NOT_FOUND): the reader must skip the gaps.
    return FakeGpu(name="NVIDIA A100-SXM4-80GB", uuid=A100, memory_mib=81920, compute_capability=(8, 0),
                   mig_capable=True, mig_enabled=True, profiles=dict(A100_80GB_PROFILES),
                   mig=[FakeMig("1g.10gb", 6, MIG_1G, 9728, slot=5), FakeMig("3g.40gb", 0, MIG_3G, 40192, slot=0),
                        FakeMig("2g.20gb", 4, MIG_2G, 19968, slot=2)])


def h100() -> FakeGpu:
    return FakeGpu(name="NVIDIA H100 80GB HBM3", uuid=H100, memory_mib=81559, compute_capability=(9, 0),
                   mig_capable=True, mig_enabled=False)


def t4() -> FakeGpu:
    return FakeGpu(name="Tesla T4", uuid=T4, memory_mib=15360, compute_capability=(7, 5))


def fake() -> FakeNvml:
    return FakeNvml([a100_mig(), h100(), t4()])


def config() -> AgentConfig:
    # The H100 by index and the T4 by UUID; the A100's MIG mode wins over any config.
    return AgentConfig.model_validate({
        "default": {"mode": "exclusive"},
        "gpus": [{"match": "0", "mode": "mps", "replicas": 2}, {"match": T4, "mode": "timeslice", "replicas": 4}],
        "nodes": {NODE: {"gpus": [{"match": "1", "mode": "mps", "replicas": 4}]}},
    })


def k8s_node(annotation: list[dict[str, Any]]) -> dict[str, Any]:
    return {"metadata": {"name": NODE, "annotations": {GPUS_ANNOTATION: json.dumps(annotation)}}}


# ---------------------------------------------------------------------------------------------------------------
# names


@pytest.mark.parametrize("raw, product", [
    ("NVIDIA A100-SXM4-80GB", "NVIDIA-A100-SXM4-80GB"),
    ("Tesla T4", "Tesla-T4"),
    ("NVIDIA H100 80GB HBM3", "NVIDIA-H100-80GB-HBM3"),
    ("NVIDIA RTX 6000 Ada Generation", "NVIDIA-RTX-6000-Ada-Generation"),
    ("NVIDIA GeForce RTX 4090 (Laptop)", "NVIDIA-GeForce-RTX-4090-Laptop"),
    ("  NVIDIA  H200 NVL ", "NVIDIA-H200-NVL"),
])
def test_product_spelled_as_gfd(raw: str, product: str) -> None:
    assert gfd_product(raw) == product


@pytest.mark.parametrize("mem_mb, total_mib, gb", [
    (9856, 81920, 10), (19968, 81920, 20), (40192, 81920, 40), (80384, 81920, 80),  # A100 80GB
    (4864, 40960, 5), (9856, 40960, 10), (19968, 40960, 20),  # A100 40GB
    (16384, 143771, 18), (33024, 143771, 35), (71168, 143771, 71),  # H200: 4 x 1/8 x 141 = 70.5 -> 71
    (11008, 95830, 12), (47488, 95830, 47),  # H100 NVL
])
def test_mig_memory_gb_as_go_nvlib(mem_mb: int, total_mib: int, gb: int) -> None:
    assert mig_memory_gb(mem_mb, total_mib * 1024 * 1024) == gb


def test_profile_name_suffixes_follow_the_profile_index() -> None:
    total = 81920 * 1024 * 1024
    assert mig_profile_name(0x0, 1, 9856, total) == "1g.10gb"
    assert mig_profile_name(0x7, 1, 9856, total) == "1g.10gb+me"
    assert mig_profile_name(0x9, 1, 19968, total) == "1g.20gb"
    assert mig_profile_name(0x2, 3, 40192, total) == "3g.40gb"
    assert mig_profile_name(0xD, 1, 9856, total) == "1g.10gb-me"
    assert mig_profile_name(0xF, 1, 9856, total) == "1g.10gb+me.all"
    assert mig_profile_name(0xA, 1, 9856, total) == "1g.10gb+gfx"
    assert mig_profile_name(0x40, 2, 19968, total) == "2g.20gb"  # unknown index: NVML's slice count


# ---------------------------------------------------------------------------------------------------------------
# reading


def test_read_gpus_on_the_fake() -> None:
    nvml = fake()
    gpus = read_gpus(nvml)
    assert nvml.initialised == 0 and nvml.calls[0] == "nvmlInit" and nvml.calls[-1] == "nvmlShutdown"
    assert set(nvml.calls) <= READ_ONLY_CALLS
    a100, h, t = gpus
    assert (a100.index, a100.uuid, a100.name, a100.product) == (0, A100, "NVIDIA A100-SXM4-80GB",
                                                                  "NVIDIA-A100-SXM4-80GB")
    assert a100.memory_mib == 81920 and a100.compute_capability == (8, 0) and a100.mig_enabled and a100.healthy
    assert [(m.profile, m.start, m.uuid, m.memory_mib, m.slot) for m in a100.mig] == [
        ("3g.40gb", 0, MIG_3G, 40192, 0), ("2g.20gb", 4, MIG_2G, 19968, 2), ("1g.10gb", 6, MIG_1G, 9728, 5)]
    assert [m.profile_id for m in a100.mig] == [9, 14, 19]
    assert len({m.gpu_instance_id for m in a100.mig}) == 3
    assert (h.product, h.memory_mib, h.compute_capability, h.mig_enabled, h.mig) == (
        "NVIDIA-H100-80GB-HBM3", 81559, (9, 0), False, ())
    assert (t.product, t.mig_enabled, t.mig_pending, t.compute_capability) == ("Tesla-T4", False, None, (7, 5))


def test_older_bindings_bytes_and_profile_info_v1() -> None:
    class BytesNvml(FakeNvml):
        def nvmlDeviceGetName(self, handle: Any) -> Any:
            return super().nvmlDeviceGetName(handle).encode()

        def nvmlDeviceGetUUID(self, handle: Any) -> Any:
            return super().nvmlDeviceGetUUID(handle).encode()

    gpus = read_gpus(BytesNvml([a100_mig(), t4()], legacy_profile_info=True))
    assert gpus[0].uuid == A100 and gpus[0].product == "NVIDIA-A100-SXM4-80GB"
    assert [m.profile for m in gpus[0].mig] == ["3g.40gb", "2g.20gb", "1g.10gb"]
    assert gpus[0].mig[0].uuid == MIG_3G


def test_pending_mig_mode_does_not_count() -> None:
    gpu = h100()
    gpu.mig_pending = True  # enabled after the next GPU reset: still a whole GPU now
    (raw,) = read_gpus(FakeNvml([gpu]))
    assert not raw.mig_enabled and raw.mig_pending is True


@pytest.mark.parametrize("at, code, words", [
    ("memory", None, "memory info: GPU is lost"),
    ("handle", NVML_ERROR_UNKNOWN, "device handle: Unknown Error"),
    ("uuid", None, "UUID: GPU is lost"),
    ("mig", None, "MIG mode: GPU is lost"),
])
def test_lost_gpu_is_unhealthy_and_left_out(at: str, code: int | None, words: str) -> None:
    nvml = fake()
    if code is None:
        nvml.lose(1, at=at)
    else:
        nvml.lose(1, at=at, code=code)
    gpus = read_gpus(nvml)
    assert nvml.initialised == 0
    lost = gpus[1]
    assert not lost.healthy and words in lost.reason
    assert gpus[0].healthy and gpus[2].healthy
    annotation = to_annotation(gpus, config(), NODE)
    assert [g["index"] for g in annotation] == [0, 2]
    (report,) = health_report(gpus)
    assert report["index"] == 1 and words in report["reason"]
    assert node_from_k8s(k8s_node(annotation), default_catalog()).gpus[1].index == 2


def test_broken_mig_instance_makes_the_gpu_unhealthy() -> None:
    nvml = fake()
    nvml.gpus[0].hidden_profile_indexes = {A100_80GB_PROFILES["2g.20gb"].index}  # profile ID 14 not listed
    gpus = read_gpus(nvml)
    assert not gpus[0].healthy and "profile ID 14" in gpus[0].reason
    assert [g["index"] for g in to_annotation(gpus, config(), NODE)] == [1, 2]


def test_nvml_unavailable() -> None:
    nvml = FakeNvml([], init_error=NVML_ERROR_DRIVER_NOT_LOADED)
    with pytest.raises(NvmlUnavailable, match="Driver Not Loaded"):
        read_gpus(nvml)


def test_real_binding_reads_or_says_unavailable() -> None:
    # On a machine without a driver pynvml's init fails: a clear NvmlUnavailable, never another exception.
    try:
        gpus = read_gpus()
    except NvmlUnavailable as exc:
        assert "NVML" in str(exc) or "pynvml" in str(exc)
    else:
        assert all(g.uuid for g in gpus if g.healthy)


# ---------------------------------------------------------------------------------------------------------------
# the annotation


def test_annotation_from_nvml_and_config() -> None:
    annotation = to_annotation(read_gpus(fake()), config(), NODE)
    assert annotation == [
        {"index": 0, "uuid": A100, "product": "NVIDIA-A100-SXM4-80GB", "memory_mib": 81920, "mode": "mig",
         "mig": [{"profile": "3g.40gb", "start": 0, "uuid": MIG_3G, "memory_mib": 40192},
                 {"profile": "2g.20gb", "start": 4, "uuid": MIG_2G, "memory_mib": 19968},
                 {"profile": "1g.10gb", "start": 6, "uuid": MIG_1G, "memory_mib": 9728}]},
        {"index": 1, "uuid": H100, "product": "NVIDIA-H100-80GB-HBM3", "memory_mib": 81559, "mode": "mps",
         "replicas": 4},
        {"index": 2, "uuid": T4, "product": "Tesla-T4", "memory_mib": 15360, "mode": "timeslice", "replicas": 4},
    ]
    node = node_from_k8s(k8s_node(annotation), default_catalog())
    assert not node.warnings
    a100, h, t = node.gpus
    assert (a100.mode, a100.model, h.mode, h.replicas, h.model, t.mode, t.replicas, t.model) == (
        Mode.MIG, "A100-80GB", Mode.MPS, 4, "H100-80GB", Mode.TIMESLICE, 4, "T4")
    # NVML's instance memory wins over the catalog's figure.
    assert [(m.profile, m.start, m.memory_mib, m.uuid) for m in a100.mig] == [
        ("3g.40gb", 0, 40192, MIG_3G), ("2g.20gb", 4, 19968, MIG_2G), ("1g.10gb", 6, 9728, MIG_1G)]


def test_annotation_omits_replicas_when_none() -> None:
    cfg = AgentConfig.model_validate({"default": {"mode": "mps"}, "gpus": [{"match": "2", "replicas": 1}]})
    annotation = to_annotation(read_gpus(FakeNvml([h100(), t4(), t4()])), cfg, NODE)
    assert annotation[0]["mode"] == "mps" and "replicas" not in annotation[0]
    assert annotation[2]["mode"] == "exclusive" and "replicas" not in annotation[2]
    node_from_k8s(k8s_node(annotation), default_catalog())


def test_nvml_inventory_source() -> None:
    nvml = fake()
    nvml.lose(2)
    inv = NvmlInventory(config(), NODE, nvml=nvml)
    value = inv.read()
    assert [g["index"] for g in value] == [0, 1]
    assert [u["index"] for u in inv.unhealthy()] == [2]


def test_nvml_inventory_leaves_out_a_gpu_the_extender_cannot_read() -> None:
    # A MIG GPU whose model the catalog does not know: the extender would reject the whole annotation.
    odd = a100_mig()
    odd.name, odd.uuid = "NVIDIA Z999 MIG Prototype", "GPU-z999"
    inv = NvmlInventory(config(), NODE, nvml=FakeNvml([odd, h100()]))
    assert [g["index"] for g in inv.read()] == [1]
    (report,) = inv.unhealthy()
    assert report["index"] == 0 and report["uuid"] == "GPU-z999"
    assert report["reason"].startswith("not publishable: product: mode mig needs a known MIG-capable product")


def test_nvml_inventory_reads_through_any_gpu_reader() -> None:
    # A second vendor's agent reader is one class with `read()`: the inventory publishes what it returns.
    class OtherVendor:
        def read(self) -> list[RawGpu]:
            return [RawGpu(index=0, uuid="GPU-other-0", name="Other T4", product="Tesla-T4", memory_mib=15360,
                           compute_capability=None, mig_enabled=False),
                    RawGpu(index=1, uuid="GPU-other-1", name="Other T4", product="Tesla-T4", memory_mib=0,
                           compute_capability=None, mig_enabled=False, healthy=False, reason="gone")]

    reader: GpuReader = OtherVendor()
    inv = NvmlInventory(config(), NODE, reader=reader)
    assert [(g["index"], g["uuid"], g["product"]) for g in inv.read()] == [(0, "GPU-other-0", "Tesla-T4")]
    assert [(u["index"], u["reason"]) for u in inv.unhealthy()] == [(1, "gone")]


def test_nvml_unavailable_is_the_vendor_neutral_error() -> None:
    with pytest.raises(GpuReaderUnavailable, match="Driver Not Loaded"):
        NvmlReader(FakeNvml([], init_error=NVML_ERROR_DRIVER_NOT_LOADED)).read()


# ---------------------------------------------------------------------------------------------------------------
# read-only


def test_modules_never_call_nvml_writers() -> None:
    for rel in ("nodeagent/nvml.py", "nodeagent/inventory.py", "scripts/nvml_check.py"):
        text = (ROOT / rel).read_text(encoding="utf-8")
        assert not WRITING_NVML.findall(text), rel
        # Calls through getattr(nvml, "...") would dodge the grep: the module has none.
        assert not re.search(r"getattr\(\s*nvml\s*,\s*['\"]nvml", text), rel
    # The grep itself catches what it should.
    assert WRITING_NVML.search("nvml.nvmlDeviceSetMigMode(h, 1)")
    assert WRITING_NVML.search("nvml.nvmlGpuInstanceDestroy(gi)")
    assert not WRITING_NVML.search("nvml.nvmlDeviceGetMigMode(h)")


def test_nvidia_smi_commands_only_list() -> None:
    check = _load_check()
    allowed = {("-q", "-x"), ("-L",), ("mig", "-lgi"),
               ("--query-compute-apps=pid,gpu_uuid,used_memory", "--format=csv,noheader,nounits")}
    assert set(check.NVIDIA_SMI_COMMANDS.values()) <= allowed
    text = (ROOT / "scripts/nvml_check.py").read_text(encoding="utf-8")
    for flag in ("-pm", "-mig", "-cgi", "-dgi", "-cci", "-dci", "-rgc", "--gpu-reset", '"-r"', '"-c"', "-e "):
        assert flag not in text.replace("--memory-tolerance-mib", ""), flag


# ---------------------------------------------------------------------------------------------------------------
# the file source


def write(tmp_path: Path, value: Any, name: str = "gpus.json") -> Path:
    path = tmp_path / name
    path.write_text(value if isinstance(value, str) else json.dumps(value), encoding="utf-8")
    return path


def good_value() -> list[dict[str, Any]]:
    return to_annotation(read_gpus(fake()), config(), NODE)


def test_file_inventory_reads_a_valid_file(tmp_path: Path) -> None:
    path = write(tmp_path, good_value())
    assert FileInventory(path).read() == good_value()


@pytest.mark.parametrize("mutate, words", [
    (lambda v: "[{", "not valid JSON"),
    (lambda v: {"gpus": v}, "expected a JSON list"),
    (lambda v: [*v[:1], {**v[1], "mode": "shared"}, v[2]], "item [1].mode: must be one of"),
    (lambda v: [{**v[0], "mig": [v[0]["mig"][0], {**v[0]["mig"][1], "profile": "5g.50gb"}]}],
     "item [0].mig[1].profile: A100-80GB has no MIG profile '5g.50gb'"),
    (lambda v: [v[0], {k: x for k, x in v[1].items() if k != "uuid"}], "item [1].uuid: required"),
    (lambda v: [{**v[0], "mig": [v[0]["mig"][0], {k: x for k, x in v[0]["mig"][1].items() if k != "uuid"}]}],
     "item [0].mig[1].uuid: required"),
    (lambda v: [v[0], {**v[1], "uuid": MIG_3G}], "item [1].uuid: duplicate"),
    (lambda v: [v[0], {**v[1], "index": 0}], "item [1].index: duplicate GPU index 0"),
])
def test_file_inventory_errors_name_file_and_item(tmp_path: Path, mutate: Any, words: str) -> None:
    path = write(tmp_path, mutate(good_value()))
    with pytest.raises(InventoryError) as err:
        FileInventory(path).read()
    assert str(err.value).startswith(f"{path}: ") and words in str(err.value)


def test_file_inventory_missing_file(tmp_path: Path) -> None:
    with pytest.raises(InventoryError, match="cannot read"):
        FileInventory(tmp_path / "absent.json").read()


def test_json_error_has_line_and_column(tmp_path: Path) -> None:
    with pytest.raises(InventoryError, match=r"line 2 column"):
        FileInventory(write(tmp_path, '[\n  {"index": 0,,}]')).read()


def test_validate_returns_parser_warnings() -> None:
    value = [{"index": 0, "uuid": "GPU-x", "product": "NVIDIA-Mystery-9000", "memory_mib": 12345,
              "mode": "exclusive"}]
    assert any("unknown product" in w for w in validate_annotation(value, "test"))


# ---------------------------------------------------------------------------------------------------------------
# scripts/nvml_check.py


def _load_check() -> Any:
    if "nvml_check" in sys.modules:
        return sys.modules["nvml_check"]
    spec = importlib.util.spec_from_file_location("nvml_check", ROOT / "scripts/nvml_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["nvml_check"] = module  # dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    return module


SMI_XML = f"""<?xml version="1.0" ?>
<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v12.dtd">
<nvidia_smi_log>
  <driver_version>550.107.02</driver_version>
  <gpu id="00000000:07:00.0">
    <product_name>NVIDIA A100-SXM4-80GB</product_name>
    <mig_mode><current_mig>Enabled</current_mig><pending_mig>Enabled</pending_mig></mig_mode>
    <mig_devices>
      <mig_device><index>0</index><gpu_instance_id>1</gpu_instance_id><compute_instance_id>0</compute_instance_id>
        <fb_memory_usage><total>40192 MiB</total><reserved>0 MiB</reserved></fb_memory_usage></mig_device>
      <mig_device><index>1</index><gpu_instance_id>3</gpu_instance_id><compute_instance_id>0</compute_instance_id>
        <fb_memory_usage><total>19968 MiB</total></fb_memory_usage></mig_device>
      <mig_device><index>2</index><gpu_instance_id>2</gpu_instance_id><compute_instance_id>0</compute_instance_id>
        <fb_memory_usage><total>9728 MiB</total></fb_memory_usage></mig_device>
    </mig_devices>
    <uuid>{A100}</uuid>
    <fb_memory_usage><total>81920 MiB</total><reserved>446 MiB</reserved></fb_memory_usage>
  </gpu>
  <gpu id="00000000:0A:00.0">
    <product_name>NVIDIA H100 80GB HBM3</product_name>
    <mig_mode><current_mig>Disabled</current_mig><pending_mig>Disabled</pending_mig></mig_mode>
    <mig_devices>None</mig_devices>
    <uuid>{H100}</uuid>
    <fb_memory_usage><total>81559 MiB</total></fb_memory_usage>
  </gpu>
  <gpu id="00000000:0B:00.0">
    <product_name>Tesla T4</product_name>
    <mig_mode><current_mig>N/A</current_mig><pending_mig>N/A</pending_mig></mig_mode>
    <uuid>{T4}</uuid>
    <fb_memory_usage><total>15360 MiB</total></fb_memory_usage>
  </gpu>
</nvidia_smi_log>
"""

SMI_LIST = f"""GPU 0: NVIDIA A100-SXM4-80GB (UUID: {A100})
  MIG 3g.40gb     Device  0: (UUID: {MIG_3G})
  MIG 2g.20gb     Device  1: (UUID: {MIG_2G})
  MIG 1g.10gb     Device  2: (UUID: {MIG_1G})
GPU 1: NVIDIA H100 80GB HBM3 (UUID: {H100})
GPU 2: Tesla T4 (UUID: {T4})
"""

SMI_LGI = """+-------------------------------------------------------+
| GPU instances:                                        |
| GPU   Name             Profile  Instance   Placement  |
|                          ID       ID       Start:Size |
|=======================================================|
|   0  MIG 3g.40gb          9        1          0:4     |
+-------------------------------------------------------+
|   0  MIG 2g.20gb         14        3          4:2     |
+-------------------------------------------------------+
|   0  MIG 1g.10gb         19        2          6:1     |
+-------------------------------------------------------+
"""


class _NumberedNvml(FakeNvml):
    """GPU-instance ids as in the nvidia-smi sample (1 for 3g, 3 for 2g, 2 for 1g)."""

    @staticmethod
    def _gi_id(gpu: FakeGpu, mig: FakeMig) -> int:
        return {MIG_3G: 1, MIG_2G: 3, MIG_1G: 2}.get(mig.uuid, gpu.mig.index(mig) + 1)


def _smi_view(check: Any) -> Any:
    return check.merge(check.parse_query_xml(SMI_XML), check.parse_list(SMI_LIST),
                       check.parse_gpu_instances(SMI_LGI))


def test_check_parses_nvidia_smi() -> None:
    check = _load_check()
    smi = _smi_view(check)
    assert [(g.index, g.uuid, g.memory_mib, g.mig_mode) for g in smi] == [
        (0, A100, 81920, "Enabled"), (1, H100, 81559, "Disabled"), (2, T4, 15360, None)]
    assert [(m.uuid, m.memory_mib, m.gpu_instance_id, m.profile, m.start) for m in smi[0].mig] == [
        (MIG_3G, 40192, 1, "3g.40gb", 0), (MIG_2G, 19968, 3, "2g.20gb", 4), (MIG_1G, 9728, 2, "1g.10gb", 6)]


def test_check_agrees_with_nvml_and_finds_mismatches() -> None:
    check = _load_check()
    nvml_gpus = read_gpus(_NumberedNvml([a100_mig(), h100(), t4()]))
    bad, _notes = check.compare(nvml_gpus, _smi_view(check))
    assert bad == []

    smi = _smi_view(check)
    smi[1].memory_mib = 81000
    smi[0].mig[1].start = 2
    smi[2].mig_mode = "Enabled"
    del smi[0].mig[2]
    bad, _ = check.compare(nvml_gpus, smi)
    assert any("memory NVML 81559 MiB, nvidia-smi 81000 MiB" in b for b in bad)
    assert any(f"MIG {MIG_2G}: start NVML 4, nvidia-smi 2" in b for b in bad)
    assert any("MIG mode NVML disabled, nvidia-smi Enabled" in b for b in bad)
    assert any(f"MIG device {MIG_1G} (1g.10gb@6) not in nvidia-smi" in b for b in bad)


def test_check_without_mig_uuids_in_the_listing_notes_not_fails() -> None:
    check = _load_check()
    smi = check.merge(check.parse_query_xml(SMI_XML), {}, check.parse_gpu_instances(SMI_LGI))
    nvml_gpus = read_gpus(_NumberedNvml([a100_mig(), h100(), t4()]))
    bad, notes = check.compare(nvml_gpus, smi)
    assert any("without a UUID" in n for n in notes)
    assert bad == []  # matched by GPU-instance id instead
    smi[0].mig[0].gpu_instance_id = 7
    bad, _ = check.compare(nvml_gpus, smi)
    assert any("GPU instance 7 in nvidia-smi, not read through NVML" in b for b in bad)
    assert any(f"MIG device {MIG_3G} (3g.40gb@0) not in nvidia-smi" in b for b in bad)


def stand_in_smi(tmp_path: Path, more: dict[str, str]) -> Path:
    """An executable `nvidia-smi` answering the check's queries with the fixtures above (and `more`: arguments ->
    output), any other call with exit 9."""
    answers = {"-q -x": SMI_XML, "-L": SMI_LIST, "mig -lgi": SMI_LGI, **more}
    cases = []
    for k, (args, text) in enumerate(answers.items()):
        (tmp_path / f"out{k}.txt").write_text(text, encoding="utf-8")
        cases.append(f'  "{args}") cat "{tmp_path}/out{k}.txt" ;;')
    smi = tmp_path / "nvidia-smi"
    body = "\n".join(cases)
    smi.write_text(f'#!/bin/sh\ncase "$*" in\n{body}\n  *) echo "unexpected: $*" >&2; exit 9 ;;\nesac\n',
                   encoding="utf-8")
    smi.chmod(0o755)
    return smi


def test_check_end_to_end_with_a_stand_in_nvidia_smi(tmp_path: Path) -> None:
    check = _load_check()
    smi = stand_in_smi(tmp_path, {})
    report = check.run(str(smi), 0, nvml=_NumberedNvml([a100_mig(), h100(), t4()]))
    assert report["ok"] and report["mismatches"] == [], report
    assert {c["rc"] for c in report["commands"].values()} == {0}
    assert [g["uuid"] for g in report["nvidia_smi"]] == [A100, H100, T4]
    json.dumps(report, default=str)


# ---- the per-process check ------------------------------------------------------------------------------------


def test_check_parses_compute_apps_and_compares_the_allocating_process() -> None:
    check = _load_check()
    rows = check.parse_compute_apps(f"4242, {T4}, 612\n77, {T4}, [N/A]\nNo running processes found\n")
    assert rows == [(4242, T4, 612), (77, T4, None)]
    from nodeagent.usage import GpuProcess

    agent = [GpuProcess(4242, T4, T4, 612 * 1024 * 1024)]
    assert check.compare_process(4242, 512, agent, rows) == ([], [])
    bad, _ = check.compare_process(4242, 1024, agent, rows)
    assert any("below the 1024 MiB allocated" in b for b in bad)
    bad, _ = check.compare_process(4242, 512, [GpuProcess(4242, T4, T4, 700 * 1024 * 1024)], rows)
    assert any("nvidia-smi 612 MiB" in b for b in bad)
    bad, _ = check.compare_process(9, 512, agent, rows)
    assert any("not among NVML's processes" in b for b in bad)


def test_check_per_process_end_to_end_with_stand_ins(tmp_path: Path) -> None:
    from fakes.pynvml_fake import FakeProcess

    check = _load_check()
    smi = stand_in_smi(tmp_path, {"--query-compute-apps=pid,gpu_uuid,used_memory --format=csv,noheader,nounits":
                                  f"4242, {T4}, 612\n"})
    gpus = [a100_mig(), h100(), t4()]
    gpus[2].processes = [FakeProcess(4242, 612 * 1024 * 1024)]

    class Child:
        pid = 4242

    report = check.run(str(smi), 0, nvml=_NumberedNvml(gpus), allocate_mib=512, allocate=lambda mib: (Child(), ""))
    assert report["ok"], report
    assert report["processes"]["nvidia_smi"] == [(4242, T4, 612)]
    skipped = check.run(str(smi), 0, nvml=_NumberedNvml([a100_mig(), h100(), t4()]), allocate_mib=512,
                        allocate=lambda mib: (None, "skip: neither libcuda.so.1 nor libcudart.so loads"))
    assert skipped["ok"] and any("per-process check skipped" in n for n in skipped["notes"])


def test_the_allocating_child_skips_without_cuda() -> None:
    check = _load_check()
    child, why = check._allocate(1)  # noqa: SLF001 - the real child, on a machine without CUDA: it says so
    if child is not None:  # a CUDA machine: it allocated; let it go
        child.communicate(input="", timeout=60)
        return
    assert why.startswith("skip:")
