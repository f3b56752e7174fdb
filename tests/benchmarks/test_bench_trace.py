"""Trace loading: typed records, clamping as the simulator's converter does, errors naming file/row/column."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.trace import (
    DATA_DIR,
    DEFAULT_NODES_CSV,
    DEFAULT_PODS_CSV,
    load_nodes,
    load_tasks,
)
from packing.model import InputError

POD_HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_shipped_trace_counts() -> None:
    nodes = load_nodes(DEFAULT_NODES_CSV)
    tasks = load_tasks(DEFAULT_PODS_CSV)
    assert len(nodes) == 1213
    assert sum(n.gpu_count for n in nodes) == 6212
    assert len(tasks) == 8152
    # Counted by the simulator (reference §0): CPU-only 1088, sharing 3078, 1 whole GPU 3911, 2/4/8-GPU 16/15/44.
    assert sum(t.num_gpu == 0 for t in tasks) == 1088
    assert sum(t.num_gpu == 1 and t.gpu_milli < 1000 for t in tasks) == 3078
    assert sum(t.num_gpu == 1 and t.gpu_milli == 1000 for t in tasks) == 3911
    assert [sum(t.num_gpu == k for t in tasks) for k in (2, 4, 8)] == [16, 15, 44]
    assert sum(t.total_gpu_milli for t in tasks) == 6086800  # 98.0 % of 6212 GPUs


def test_other_shipped_traces_load() -> None:
    assert any(t.gpu_spec for t in load_tasks(DATA_DIR / "openb_pod_list_gpuspec10.csv"))
    multi = load_tasks(DATA_DIR / "openb_pod_list_multigpu20.csv")  # only five columns
    assert len(multi) == 8324 and all(t.gpu_spec == () for t in multi)
    share = load_tasks(DATA_DIR / "openb_pod_list_gpushare100.csv")
    assert all(t.num_gpu == 0 or t.gpu_milli < 1000 for t in share)


def test_gpu_spec_split_and_clamping(tmp_path: Path) -> None:
    p = write(tmp_path, "pods.csv", POD_HEADER
              + "a,1000,100,1,1500,T4|G2,LS,Running,0,1,0\n"  # > 1000 -> 1000
              + "b,1000,100,1,-5,,LS,Running,0,1,0\n"  # GPU task with <= 0 -> 0
              + "c,1000,100,0,300,,LS,Running,0,1,0\n"  # CPU-only carries no GPU milli
              + "d,1000,100,1,460.0,,LS,Running,0,1,0\n")  # integral float accepted
    a, b, c, d = load_tasks(p)
    assert a.gpu_milli == 1000 and a.gpu_spec == ("T4", "G2")
    assert a.spec_key == (1000, 1000, 1, "T4|G2")
    assert b.gpu_milli == 0 and b.num_gpu == 1
    assert c.gpu_milli == 0 and c.total_gpu_milli == 0
    assert d.gpu_milli == 460


@pytest.mark.parametrize(("row", "column", "words"), [
    ("x,abc,100,1,500,,LS,Running,0,1,0\n", "cpu_milli", "not an integer"),
    ("x,1000,100,1,,,LS,Running,0,1,0\n", "gpu_milli", "missing"),
    ("x,1000,-1,1,500,,LS,Running,0,1,0\n", "memory_mib", ">= 0"),
    ("x,1000,100,9,1000,,LS,Running,0,1,0\n", "num_gpu", "<= 8"),
    ("x,1000,100,2,500,,LS,Running,0,1,0\n", "gpu_milli", "whole GPUs"),
    (",1000,100,1,500,,LS,Running,0,1,0\n", "name", "missing"),
    ("x,1000,100,1.5,500,,LS,Running,0,1,0\n", "num_gpu", "not an integer"),
])
def test_pod_errors_name_file_row_column(tmp_path: Path, row: str, column: str, words: str) -> None:
    p = write(tmp_path, "bad_pods.csv", POD_HEADER + "ok,1000,100,1,500,,LS,Running,0,1,0\n" + row)
    with pytest.raises(InputError) as err:
        load_tasks(p)
    assert err.value.obj == "bad_pods.csv row 3"
    assert err.value.field_name == column
    assert words in str(err.value)


def test_missing_column_and_file(tmp_path: Path) -> None:
    p = write(tmp_path, "pods.csv", "name,cpu_milli,memory_mib,num_gpu\nx,1,1,0\n")
    with pytest.raises(InputError, match="gpu_milli") as err:
        load_tasks(p)
    assert err.value.obj == "pods.csv row 1"
    with pytest.raises(InputError, match="file not found"):
        load_tasks(tmp_path / "nope.csv")
    with pytest.raises(InputError, match="no tasks"):
        load_tasks(write(tmp_path, "empty.csv", POD_HEADER))


def test_node_errors(tmp_path: Path) -> None:
    head = "sn,cpu_milli,memory_mib,gpu,model\n"
    good = load_nodes(write(tmp_path, "n.csv", head + "n0,96000,393216,8,G2\nn1,8000,100,0,\n"))
    assert good[0].gpu_count == 8 and good[0].model == "G2" and good[1].gpu_count == 0
    with pytest.raises(InputError) as err:
        load_nodes(write(tmp_path, "dup.csv", head + "n0,1,1,1,T4\nn0,1,1,1,T4\n"))
    assert (err.value.obj, err.value.field_name) == ("dup.csv row 3", "sn")
    with pytest.raises(InputError) as err:
        load_nodes(write(tmp_path, "nomodel.csv", head + "n0,1,1,2,\n"))
    assert (err.value.obj, err.value.field_name) == ("nomodel.csv row 2", "model")
    with pytest.raises(InputError) as err:
        load_nodes(write(tmp_path, "badgpu.csv", head + "n0,1,1,two,T4\n"))
    assert err.value.field_name == "gpu"
