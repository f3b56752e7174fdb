#!/usr/bin/env python3
"""Check nodeagent.nvml against nvidia-smi on a real GPU machine. Read-only.

    python scripts/nvml_check.py --out nvml-check.json

Reads the GPUs with `nodeagent.nvml.read_gpus()` and with nvidia-smi, and compares, GPU by GPU (by UUID):
total memory, current MIG mode, and the MIG instances (UUID, memory, GPU-instance id, profile name, placement
start). Prints a report, writes it as JSON to --out, exits 1 on any mismatch (2 when nothing could be read).

Per process (`--allocate-mib N`, default 512; 0 skips): a child process allocates N MiB on CUDA device 0 through
the CUDA driver API (ctypes, libcuda.so.1; else libcudart; neither: skipped with a note), and the agent's per-process
figure (`nodeagent.usage.sample_processes`, NVML) must show that PID with at least N MiB and agree with
`nvidia-smi --query-compute-apps` (to the MiB). The child only allocates; nothing on the GPU is set.

Only nvidia-smi's listing commands run (`NVIDIA_SMI_COMMANDS`): `-q -x` (the full query as XML), `-L` (GPU and
MIG device UUIDs with profile names), `mig -lgi` (GPU instances: profile, id, placement) and
`--query-compute-apps` (processes: pid, GPU UUID, used memory). None changes a setting. The XML has no MIG profile names or placements and, in many driver versions, no MIG UUIDs; the two
listings fill those in, and a field nvidia-smi does not show is skipped (noted), not counted as a mismatch.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# Every nvidia-smi invocation of this script; all list or query, none writes (tests check the allowlist).
NVIDIA_SMI_COMMANDS: dict[str, tuple[str, ...]] = {
    "query": ("-q", "-x"),
    "list": ("-L",),
    "gpu_instances": ("mig", "-lgi"),
    "compute_apps": ("--query-compute-apps=pid,gpu_uuid,used_memory", "--format=csv,noheader,nounits"),
}

# The child that holds a known allocation: CUDA driver API first (ships with the driver), runtime API second.
# It prints "ready" once the memory is allocated and holds it until its stdin closes.
ALLOCATOR = r"""
import ctypes, sys
mib = int(sys.argv[1])
size = ctypes.c_size_t(mib * 1024 * 1024)
ptr = ctypes.c_void_p()
try:
    cuda = ctypes.CDLL("libcuda.so.1")
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    rc = cuda.cuInit(0) or cuda.cuDeviceGet(ctypes.byref(dev), 0) or cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev)         or cuda.cuMemAlloc_v2(ctypes.byref(ptr), size)
except OSError:
    try:
        cudart = ctypes.CDLL("libcudart.so")
    except OSError:
        print("skip: neither libcuda.so.1 nor libcudart.so loads", flush=True)
        sys.exit(0)
    rc = cudart.cudaMalloc(ctypes.byref(ptr), size)
if rc:
    print(f"skip: CUDA allocation failed (error {rc})", flush=True)
    sys.exit(0)
print("ready", flush=True)
sys.stdin.read()
"""

_LIST_GPU = re.compile(r"^GPU\s+(\d+):\s*(.*?)\s*\(UUID:\s*(GPU-[^)\s]+)\)")
_LIST_MIG = re.compile(r"^\s*MIG\s+(\S+)\s+Device\s+(\d+):\s*\(UUID:\s*(MIG-[^)\s]+)\)")
_LGI_ROW = re.compile(r"^\|\s*(\d+)\s+MIG\s+(\S+)\s+(\d+)\s+(\d+)\s+(\d+):(\d+)\s*\|")


@dataclass
class SmiMig:
    device_index: int | None = None
    gpu_instance_id: int | None = None
    uuid: str | None = None
    memory_mib: int | None = None
    profile: str | None = None
    start: int | None = None


@dataclass
class SmiGpu:
    index: int
    uuid: str | None
    name: str | None
    memory_mib: int | None
    mig_mode: str | None  # "Enabled" / "Disabled" / "N/A" as nvidia-smi prints it
    mig: list[SmiMig] = field(default_factory=list)


# ---------------------------------------------------------------------------------------------------------------
# Parsing nvidia-smi output


def _text(elem: ET.Element, path: str) -> str | None:
    found = elem.find(path)
    if found is None or found.text is None:
        return None
    value = found.text.strip()
    return value if value and value.upper() not in ("N/A", "NONE") else None


def _int(text: str | None) -> int | None:
    if text is None:
        return None
    m = re.match(r"^\s*(\d+)", text)
    return int(m.group(1)) if m else None


def _mib(text: str | None) -> int | None:
    """ "81920 MiB" -> 81920; other units converted; None when absent or N/A."""
    if text is None:
        return None
    m = re.match(r"^\s*([\d.]+)\s*([KMGT]i?B)?\s*$", text, re.IGNORECASE)
    if not m:
        return None
    scale = {"KIB": 1 / 1024, "KB": 1 / 1024, "MIB": 1, "MB": 1, "GIB": 1024, "GB": 1024, "TIB": 1024 ** 2,
             "TB": 1024 ** 2}
    return int(float(m.group(1)) * scale.get((m.group(2) or "MiB").upper(), 1))


def parse_query_xml(text: str) -> list[SmiGpu]:
    """`nvidia-smi -q -x`: GPUs in the order listed (nvidia-smi's index order)."""
    root = ET.fromstring(text)
    gpus = []
    for pos, g in enumerate(root.findall("gpu")):
        migs = []
        for md in g.findall("mig_devices/mig_device"):
            migs.append(SmiMig(device_index=_int(_text(md, "index")),
                               gpu_instance_id=_int(_text(md, "gpu_instance_id")),
                               uuid=_text(md, "uuid"),  # present in some driver versions only
                               memory_mib=_mib(_text(md, "fb_memory_usage/total"))))
        # The XML carries no index: GPUs come in nvidia-smi's index order (the one -L and -lgi number by).
        gpus.append(SmiGpu(index=pos,
                           uuid=_text(g, "uuid"), name=_text(g, "product_name"),
                           memory_mib=_mib(_text(g, "fb_memory_usage/total")),
                           mig_mode=_text(g, "mig_mode/current_mig"), mig=migs))
    return gpus


def parse_list(text: str) -> dict[int, tuple[str, dict[int, tuple[str, str]]]]:
    """`nvidia-smi -L`: GPU index -> (GPU UUID, {MIG device index: (profile, MIG UUID)})."""
    out: dict[int, tuple[str, dict[int, tuple[str, str]]]] = {}
    current: int | None = None
    for line in text.splitlines():
        m = _LIST_GPU.match(line.strip())
        if m:
            current = int(m.group(1))
            out[current] = (m.group(3), {})
            continue
        m = _LIST_MIG.match(line)
        if m and current is not None:
            out[current][1][int(m.group(2))] = (m.group(1), m.group(3))
    return out


def parse_gpu_instances(text: str) -> dict[tuple[int, int], tuple[str, int]]:
    """`nvidia-smi mig -lgi`: (GPU index, GPU-instance id) -> (profile, placement start)."""
    out = {}
    for line in text.splitlines():
        m = _LGI_ROW.match(line.strip())
        if m:
            out[(int(m.group(1)), int(m.group(4)))] = (m.group(2), int(m.group(5)))
    return out


def merge(query: list[SmiGpu], listing: dict[int, tuple[str, dict[int, tuple[str, str]]]],
          instances: dict[tuple[int, int], tuple[str, int]]) -> list[SmiGpu]:
    """Fill the XML's gaps (MIG UUIDs, profile names, placements) from the two listings."""
    for gpu in query:
        listed = listing.get(gpu.index)
        if listed is not None and gpu.uuid is None:
            gpu.uuid = listed[0]
        for mig in gpu.mig:
            if listed is not None and mig.device_index in listed[1]:
                profile, uuid = listed[1][mig.device_index]
                mig.uuid = mig.uuid or uuid
                mig.profile = mig.profile or profile
            if mig.gpu_instance_id is not None and (gpu.index, mig.gpu_instance_id) in instances:
                profile, start = instances[(gpu.index, mig.gpu_instance_id)]
                mig.profile = profile  # -lgi names the GPU instance itself: preferred over -L's device name
                mig.start = start
    return query


# ---------------------------------------------------------------------------------------------------------------
# Comparing


def compare(nvml_gpus: list[Any], smi_gpus: list[SmiGpu], memory_tolerance_mib: int = 0) -> tuple[list[str],
                                                                                                  list[str]]:
    """(mismatches, notes) between NVML's RawGpu list and nvidia-smi's view."""
    bad: list[str] = []
    notes: list[str] = []
    smi_by_uuid = {g.uuid: g for g in smi_gpus if g.uuid}
    seen: set[str] = set()
    for g in nvml_gpus:
        where = f"GPU {g.index} ({g.uuid})"
        if not g.healthy:
            bad.append(f"{where}: NVML reports it unhealthy: {g.reason}")
            continue
        smi = smi_by_uuid.get(g.uuid)
        if smi is None:
            bad.append(f"{where}: not in nvidia-smi's output")
            continue
        seen.add(g.uuid)
        _compare_gpu(g, smi, where, memory_tolerance_mib, bad, notes)
    for uuid, smi in smi_by_uuid.items():
        if uuid not in seen and not any(g.uuid == uuid for g in nvml_gpus):
            bad.append(f"nvidia-smi GPU {smi.index} ({uuid}): not read through NVML")
    return bad, notes


def _compare_gpu(g: Any, smi: SmiGpu, where: str, tol: int, bad: list[str], notes: list[str]) -> None:
    if smi.memory_mib is None:
        notes.append(f"{where}: nvidia-smi shows no total memory")
    elif abs(smi.memory_mib - g.memory_mib) > tol:
        bad.append(f"{where}: memory NVML {g.memory_mib} MiB, nvidia-smi {smi.memory_mib} MiB")
    smi_mig = (smi.mig_mode or "").lower() == "enabled"
    if smi_mig != g.mig_enabled:
        bad.append(f"{where}: MIG mode NVML {'enabled' if g.mig_enabled else 'disabled'}, "
                   f"nvidia-smi {smi.mig_mode or 'absent'}")
    if smi_mig or g.mig_enabled:
        _compare_mig(g, smi, where, bad, notes)


def _compare_mig(g: Any, smi: SmiGpu, where: str, bad: list[str], notes: list[str]) -> None:
    """The GPU's MIG devices, NVML's against nvidia-smi's, matched by UUID (else by GPU-instance id)."""
    smi_by_uuid = {m.uuid: m for m in smi.mig if m.uuid}
    # Without a UUID (old XML, no -L listing) a MIG device can still be matched by its GPU-instance id.
    smi_by_gi = {m.gpu_instance_id: m for m in smi.mig if not m.uuid and m.gpu_instance_id is not None}
    if len(smi_by_uuid) < len(smi.mig):
        notes.append(f"{where}: {len(smi.mig) - len(smi_by_uuid)} MIG device(s) without a UUID in nvidia-smi, "
                     "matched by GPU-instance id")
    nvml_uuids = {m.uuid for m in g.mig}
    nvml_gis = {m.gpu_instance_id for m in g.mig}
    for uuid in sorted(set(smi_by_uuid) - nvml_uuids):
        bad.append(f"{where}: MIG device {uuid} in nvidia-smi, not read through NVML")
    for gi in sorted(set(smi_by_gi) - nvml_gis):
        bad.append(f"{where}: MIG device of GPU instance {gi} in nvidia-smi, not read through NVML")
    for m in g.mig:
        s = smi_by_uuid.get(m.uuid) or smi_by_gi.get(m.gpu_instance_id)
        if s is None:
            bad.append(f"{where}: MIG device {m.uuid} ({m.profile}@{m.start}) not in nvidia-smi")
            continue
        for attr, ours, theirs in (("memory_mib", m.memory_mib, s.memory_mib), ("profile", m.profile, s.profile),
                                   ("start", m.start, s.start), ("gpu_instance_id", m.gpu_instance_id,
                                                                 s.gpu_instance_id)):
            if theirs is None:
                notes.append(f"{where}: MIG {m.uuid}: nvidia-smi shows no {attr}")
            elif ours != theirs:
                bad.append(f"{where}: MIG {m.uuid}: {attr} NVML {ours!r}, nvidia-smi {theirs!r}")


# ---------------------------------------------------------------------------------------------------------------
# Running


def _smi(binary: str, name: str, commands: dict[str, Any]) -> str | None:
    args = NVIDIA_SMI_COMMANDS[name]
    try:
        done = subprocess.run([binary, *args], capture_output=True, text=True, timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        commands[name] = {"args": list(args), "error": str(exc)}
        return None
    commands[name] = {"args": list(args), "rc": done.returncode, "stderr": done.stderr.strip()[-500:]}
    # `mig -lgi` exits non-zero with "No GPU instances found" when MIG is off: still parseable (nothing).
    return done.stdout if done.returncode == 0 or name == "gpu_instances" else None


def parse_compute_apps(text: str) -> list[tuple[int, str, int | None]]:
    """`pid, gpu_uuid, used_memory` CSV rows (MiB; "[N/A]" -> None)."""
    rows: list[tuple[int, str, int | None]] = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 3 or not parts[0].isdigit():
            continue
        rows.append((int(parts[0]), parts[1], int(parts[2]) if parts[2].isdigit() else None))
    return rows


def compare_process(pid: int, want_mib: int, agent: list[Any], smi: list[tuple[int, str, int | None]]
                    ) -> tuple[list[str], list[str]]:
    """The allocating process as the agent (NVML) and nvidia-smi see it: (mismatches, notes)."""
    bad: list[str] = []
    notes: list[str] = []
    ours = {p.unit_uuid: p.used_bytes for p in agent if p.pid == pid}
    theirs = {uuid: mib for p, uuid, mib in smi if p == pid}
    if not ours:
        bad.append(f"process {pid}: allocated {want_mib} MiB, not among NVML's processes")
    if not theirs:
        notes.append(f"process {pid}: not in nvidia-smi --query-compute-apps (another PID namespace?)")
    for uuid, used in ours.items():
        if used is None:
            notes.append(f"process {pid} on {uuid}: NVML gives no per-process figure (unknown, not 0)")
            continue
        if used // (1024 * 1024) < want_mib:
            bad.append(f"process {pid} on {uuid}: NVML {used // (1024 * 1024)} MiB, below the {want_mib} MiB allocated")
        smi_mib = theirs.get(uuid)
        if uuid in theirs and smi_mib is not None and abs(smi_mib - used / (1024 * 1024)) > 1:
            bad.append(f"process {pid} on {uuid}: NVML {used / (1024 * 1024):.1f} MiB, nvidia-smi {smi_mib} MiB")
    return bad, notes


def _allocate(mib: int) -> tuple[subprocess.Popen[str] | None, str]:
    script = Path(tempfile.mkdtemp(prefix="nvml-check-")) / "allocate.py"
    script.write_text(ALLOCATOR, encoding="utf-8")
    child = subprocess.Popen([sys.executable, str(script), str(mib)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    line = child.stdout.readline().strip()
    if line != "ready":
        child.wait(timeout=60)
        return None, line or f"the allocating child exited ({child.returncode})"
    return child, ""


def check_processes(binary: str, mib: int, nvml: Any, report: dict[str, Any], allocate: Any = None) -> None:
    """The per-process part; `allocate(mib) -> (child with .pid, why not)` (a stand-in in tests)."""
    from nodeagent.usage import sample_processes

    child, why = (allocate or _allocate)(mib)
    if child is None:
        report["notes"].append(f"per-process check skipped: {why}")
        return
    try:
        agent, problems = sample_processes(nvml)
        smi = parse_compute_apps(_smi(binary, "compute_apps", report["commands"]) or "")
    finally:
        if hasattr(child, "communicate"):
            child.communicate(input="", timeout=60)
    report["processes"] = {"pid": child.pid, "allocated_mib": mib, "agent": [asdict(p) for p in agent],
                           "nvidia_smi": smi, "problems": problems}
    bad, notes = compare_process(child.pid, mib, agent, smi)
    report["mismatches"].extend(bad)
    report["notes"].extend(notes)


def run(binary: str, memory_tolerance_mib: int, nvml: Any = None, allocate_mib: int = 0,
        allocate: Any = None) -> dict[str, Any]:
    """The whole check; `nvml` is the binding (pynvml when None; a stand-in in tests)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from nodeagent.nvml import NvmlUnavailable, read_gpus

    report: dict[str, Any] = {"ok": False, "mismatches": [], "notes": [], "commands": {}}
    try:
        nvml_gpus = read_gpus(nvml)
    except NvmlUnavailable as exc:
        report["error"] = f"NVML: {exc}"
        return report
    report["nvml"] = [asdict(g) for g in nvml_gpus]
    xml = _smi(binary, "query", report["commands"])
    if xml is None:
        report["error"] = "nvidia-smi -q -x failed"
        return report
    try:
        smi = parse_query_xml(xml)
    except ET.ParseError as exc:
        report["error"] = f"nvidia-smi -q -x: not XML: {exc}"
        return report
    listing = parse_list(_smi(binary, "list", report["commands"]) or "")
    instances: dict[tuple[int, int], tuple[str, int]] = {}
    if any(g.mig for g in smi) or any(g.mig_enabled for g in nvml_gpus):
        instances = parse_gpu_instances(_smi(binary, "gpu_instances", report["commands"]) or "")
    smi = merge(smi, listing, instances)
    report["nvidia_smi"] = [asdict(g) for g in smi]
    report["mismatches"], report["notes"] = compare(nvml_gpus, smi, memory_tolerance_mib)
    if allocate_mib > 0:
        check_processes(binary, allocate_mib, nvml, report, allocate)
    report["ok"] = not report["mismatches"]
    return report


def _print(report: dict[str, Any]) -> None:
    for g in report.get("nvml", []):
        mig = ", ".join(f"{m['profile']}@{m['start']} {m['memory_mib']} MiB" for m in g["mig"])
        state = "healthy" if g["healthy"] else f"UNHEALTHY: {g['reason']}"
        print(f"GPU {g['index']} {g['uuid']} {g['product']} {g['memory_mib']} MiB cc={g['compute_capability']} "
              f"mig={'on' if g['mig_enabled'] else 'off'} {state}" + (f" [{mig}]" if mig else ""))
    for line in report.get("notes", []):
        print(f"note: {line}")
    for line in report.get("mismatches", []):
        print(f"MISMATCH: {line}")
    if "error" in report:
        print(f"ERROR: {report['error']}")
    print("OK" if report["ok"] else "FAILED")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="where to write the JSON report")
    ap.add_argument("--nvidia-smi", default="nvidia-smi", help="nvidia-smi binary (default: from PATH)")
    ap.add_argument("--memory-tolerance-mib", type=int, default=0,
                    help="allowed difference in total memory between NVML and nvidia-smi (default 0)")
    ap.add_argument("--allocate-mib", type=int, default=512,
                    help="per-process check: MiB a child CUDA process allocates (default 512; 0 skips it)")
    args = ap.parse_args(argv)
    report = run(args.nvidia_smi, args.memory_tolerance_mib, allocate_mib=args.allocate_mib)
    Path(args.out).write_text(json.dumps(report, indent=2, default=str), encoding="utf-8")
    _print(report)
    if "error" in report:
        return 2
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
