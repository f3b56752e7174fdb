"""Trace CSVs in the Alibaba GPU-sharing ("openb") schema -> typed records.

Node list columns: `sn,cpu_milli,memory_mib,gpu,model`.
Pod list columns: `name,cpu_milli,memory_mib,num_gpu,gpu_milli[,gpu_spec,qos,pod_phase,creation_time,
deletion_time,scheduled_time]` (the multigpu* files carry only the first five).

Every malformed value raises `packing.model.InputError` naming the file, the row (1-based line number in the
file, header = line 1) and the column: a bad trace must never turn into a silent default.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from packing.model import InputError

DATA_DIR = Path(__file__).resolve().parent / "data"
DEFAULT_NODES_CSV = DATA_DIR / "openb_node_list_gpu_node.csv"
DEFAULT_PODS_CSV = DATA_DIR / "openb_pod_list_default.csv"

MILLI = 1000  # milli-GPU in one whole GPU
MAX_GPUS_PER_TASK = 8  # the trace's num_gpu range is 0..8 (shared/traces README)

NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")


@dataclass(frozen=True)
class TraceNode:
    """One node of the trace's node list."""

    name: str
    cpu_milli: int
    memory_mib: int
    gpu_count: int
    model: str


@dataclass(frozen=True)
class TraceTask:
    """One task (pod) of a trace's pod list, after the simulator's clamping of gpu_milli."""

    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int  # per GPU, 0..1000
    gpu_spec: tuple[str, ...] = ()  # allowed GPU models; empty = any

    @property
    def total_gpu_milli(self) -> int:
        return self.num_gpu * self.gpu_milli

    @property
    def spec_key(self) -> tuple[int, int, int, str]:
        """The simulator's typical-pod key `(cpu, gpu milli, gpu count, gpu type)`; memory is not part of it."""
        return (self.cpu_milli, self.gpu_milli, self.num_gpu, "|".join(self.gpu_spec))


def _int(path: Path, line: int, column: str, raw: str | None, minimum: int = 0) -> int:
    obj = f"{path.name} row {line}"
    if raw is None or raw.strip() == "":
        raise InputError(obj, column, "missing value")
    try:
        value = int(raw.strip())
    except ValueError:
        # Some exports write integral floats ("1000.0"); accept those, nothing else.
        try:
            as_float = float(raw.strip())
        except ValueError:
            raise InputError(obj, column, f"not an integer: {raw!r}") from None
        if not as_float.is_integer():
            raise InputError(obj, column, f"not an integer: {raw!r}") from None
        value = int(as_float)
    if value < minimum:
        raise InputError(obj, column, f"must be >= {minimum}, got {value}")
    return value


def _rows(path: Path, required: tuple[str, ...]) -> tuple[list[str], list[tuple[int, dict[str, str]]]]:
    if not path.is_file():
        raise InputError(str(path), "-", "file not found")
    with path.open(newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        header = [h.strip() for h in (reader.fieldnames or [])]
        missing = [c for c in required if c not in header]
        if missing:
            raise InputError(f"{path.name} row 1", ",".join(missing), f"missing column(s); header is {header}")
        reader.fieldnames = header
        rows: list[tuple[int, dict[str, str]]] = []
        for row in reader:
            # line_num counts physical lines read so far, i.e. this row's line number
            rows.append((reader.line_num, row))
    return header, rows


def load_nodes(path: str | Path) -> list[TraceNode]:
    """Read a node list. Raises InputError on a missing column, a bad number or a duplicate node name."""
    p = Path(path)
    _, rows = _rows(p, NODE_COLUMNS)
    nodes: list[TraceNode] = []
    seen: set[str] = set()
    for line, row in rows:
        obj = f"{p.name} row {line}"
        name = (row.get("sn") or "").strip()
        if not name:
            raise InputError(obj, "sn", "missing node name")
        if name in seen:
            raise InputError(obj, "sn", f"duplicate node name {name!r}")
        seen.add(name)
        gpus = _int(p, line, "gpu", row.get("gpu"))
        model = (row.get("model") or "").strip()
        if gpus > 0 and not model:
            raise InputError(obj, "model", "missing GPU model on a node with GPUs")
        nodes.append(TraceNode(name=name, cpu_milli=_int(p, line, "cpu_milli", row.get("cpu_milli")),
                               memory_mib=_int(p, line, "memory_mib", row.get("memory_mib")),
                               gpu_count=gpus, model=model))
    if not nodes:
        raise InputError(p.name, "-", "no nodes")
    return nodes


def load_tasks(path: str | Path) -> list[TraceTask]:
    """Read a pod list, clamping gpu_milli as the simulator's CSV->YAML converter does.

    Clamping: gpu_milli > 1000 -> 1000; gpu_milli <= 0 -> 0 for GPU tasks; CPU-only tasks (num_gpu 0) carry
    gpu_milli 0 whatever the file says. A multi-GPU task must ask whole GPUs (gpu_milli 1000): the simulator
    panics on fractional multi-GPU tasks, so we reject them by row.
    """
    p = Path(path)
    header, rows = _rows(p, POD_COLUMNS)
    has_spec = "gpu_spec" in header
    tasks: list[TraceTask] = []
    for line, row in rows:
        obj = f"{p.name} row {line}"
        name = (row.get("name") or "").strip()
        if not name:
            raise InputError(obj, "name", "missing task name")
        num_gpu = _int(p, line, "num_gpu", row.get("num_gpu"))
        if num_gpu > MAX_GPUS_PER_TASK:
            raise InputError(obj, "num_gpu", f"must be <= {MAX_GPUS_PER_TASK}, got {num_gpu}")
        raw_milli = row.get("gpu_milli")
        if raw_milli is None or raw_milli.strip() == "":
            raise InputError(obj, "gpu_milli", "missing value")
        milli = _int(p, line, "gpu_milli", raw_milli, minimum=-(10**9))
        milli = 0 if num_gpu == 0 else min(max(milli, 0), MILLI)
        if num_gpu > 1 and milli != MILLI:
            raise InputError(obj, "gpu_milli", f"a {num_gpu}-GPU task must ask whole GPUs (1000), got {milli}")
        spec: tuple[str, ...] = ()
        if has_spec:
            raw_spec = (row.get("gpu_spec") or "").strip()
            spec = tuple(s.strip() for s in raw_spec.split("|") if s.strip()) if raw_spec else ()
        tasks.append(TraceTask(name=name, cpu_milli=_int(p, line, "cpu_milli", row.get("cpu_milli")),
                               memory_mib=_int(p, line, "memory_mib", row.get("memory_mib")),
                               num_gpu=num_gpu, gpu_milli=milli, gpu_spec=spec))
    if not tasks:
        raise InputError(p.name, "-", "no tasks")
    return tasks
