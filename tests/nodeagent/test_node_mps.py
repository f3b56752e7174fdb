"""nodeagent.mps: MPS control daemons supervised through the stand-in `tests/fakes/mps_control.py`.

The stand-in runs through a two-line shell wrapper written into tmp_path (`exec <venv python> mps_control.py
"$@"`), used as the supervisor's `control_path`, exactly where `nvidia-cuda-mps-control` would be.
"""

from __future__ import annotations

import os
import signal
import stat
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from nodeagent.mps import MpsGpu, MpsSupervisor, mps_gpus, thread_percentage

FAKE = Path(__file__).resolve().parents[1] / "fakes" / "mps_control.py"
PID_FILE = "nvidia-cuda-mps-control.pid"
GPU_A = MpsGpu(index=0, uuid="GPU-aaaa", replicas=4, memory_mib=81559)
GPU_B = MpsGpu(index=1, uuid="GPU-bbbb", replicas=None, memory_mib=15360)


@pytest.fixture
def control(tmp_path: Path) -> str:
    wrapper = tmp_path / "nvidia-cuda-mps-control"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKE}" "$@"\n', encoding="utf-8")
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    return str(wrapper)


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    root = tmp_path / "mps"
    yield root
    # Kill any fake daemon a failing test left behind (only the ones these tests started, by pid file).
    for pid_file in root.rglob(PID_FILE):
        try:
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
        except (OSError, ValueError):
            pass


def supervisor(root: Path, control: str, gpus: list[MpsGpu], **kw: object) -> MpsSupervisor:
    opts: dict[str, object] = {"poll_interval_s": 0.05, "command_timeout_s": 5.0, "ready_timeout_s": 5.0,
                               "thread_percentage": "auto"}
    opts.update(kw)
    return MpsSupervisor(root=root, gpus=gpus, control_path=control, **opts)  # type: ignore[arg-type]


def log_lines(root: Path, uuid: str) -> list[str]:
    path = root / uuid / "log" / "control.log"
    return path.read_text(encoding="utf-8").splitlines() if path.exists() else []


def daemon_pid(root: Path, uuid: str) -> int:
    return int((root / uuid / "pipe" / PID_FILE).read_text())


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return True


def wait_for(cond: Callable[[], bool], timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return cond()


def test_start_sets_limits_and_stop_quits(root: Path, control: str) -> None:
    sup = supervisor(root, control, [GPU_A, GPU_B])
    sup.start()
    try:
        health = sup.health()
        assert health == {"GPU-aaaa": {"healthy": True, "restarts": 0, "message": "running"},
                          "GPU-bbbb": {"healthy": True, "restarts": 0, "message": "running"}}
        for gpu in (GPU_A, GPU_B):
            assert sup.pipe_dir(gpu.uuid) == str(root / gpu.uuid / "pipe")
            assert (root / gpu.uuid / "pipe" / "control").exists() and (root / gpu.uuid / "log").is_dir()
            assert alive(daemon_pid(root, gpu.uuid))
        a = log_lines(root, "GPU-aaaa")
        # The daemon saw only its GPU; floor(81559 / 4) = 20389 MiB per client; "auto" = 100 // 4.
        assert a[0].startswith("start pid=") and a[0].endswith("CUDA_VISIBLE_DEVICES=GPU-aaaa")
        assert "cmd set_default_device_pinned_mem_limit 0 20389M" in a
        assert "cmd set_default_active_thread_percentage 25" in a
        assert a.index("cmd set_default_device_pinned_mem_limit 0 20389M") > a.index(
            "cmd get_default_active_thread_percentage")  # limits only once the daemon answers
        b = log_lines(root, "GPU-bbbb")
        assert not [line for line in b if line.startswith("cmd set_")]  # no replicas: no default limits
        assert sup.pipe_dirs() == {"GPU-aaaa": str(root / "GPU-aaaa" / "pipe"),
                                   "GPU-bbbb": str(root / "GPU-bbbb" / "pipe")}
        assert sup.client_env("GPU-aaaa") == {"CUDA_MPS_PIPE_DIRECTORY": str(root / "GPU-aaaa" / "pipe"),
                                              "CUDA_MPS_LOG_DIRECTORY": str(root / "GPU-aaaa" / "log")}
        assert sup.command("GPU-aaaa", "get_default_active_thread_percentage").strip() == "25.0"
        pids = [daemon_pid(root, g.uuid) for g in (GPU_A, GPU_B)]
    finally:
        sup.stop()
    assert all(not alive(p) for p in pids)
    assert "cmd quit" in log_lines(root, "GPU-aaaa") and "cmd quit" in log_lines(root, "GPU-bbbb")
    assert not (root / "GPU-aaaa" / "pipe" / PID_FILE).exists()
    assert {u: h["healthy"] for u, h in sup.health().items()} == {"GPU-aaaa": False, "GPU-bbbb": False}
    assert sup.pipe_dirs() == {}


def test_killed_daemon_is_restarted_and_counted(root: Path, control: str) -> None:
    sup = supervisor(root, control, [GPU_A])
    sup.start()
    try:
        first = daemon_pid(root, GPU_A.uuid)
        os.kill(first, signal.SIGKILL)  # the fake daemon this test started
        assert wait_for(lambda: sup.health()[GPU_A.uuid]["restarts"] == 1 and sup.health()[GPU_A.uuid]["healthy"])
        second = daemon_pid(root, GPU_A.uuid)
        assert second != first and alive(second) and not alive(first)
        assert sup.health()[GPU_A.uuid] == {"healthy": True, "restarts": 1, "message": "running (restart 1)"}
        lines = log_lines(root, GPU_A.uuid)
        assert len([line for line in lines if line.startswith("start pid=")]) == 2
        # The new daemon got its limits again.
        assert lines.count("cmd set_default_device_pinned_mem_limit 0 20389M") == 2
        assert lines.count("cmd set_default_active_thread_percentage 25") == 2
    finally:
        sup.stop()
    assert not alive(second)


def test_failed_starts_back_off(root: Path, control: str, tmp_path: Path) -> None:
    flag = tmp_path / "fail-start"
    flag.write_text("")
    now = [100.0]
    sup = supervisor(root, control, [GPU_A], env={**os.environ, "FAKE_MPS_FAIL_START_FILE": str(flag)},
                     backoff_initial_s=1.0, backoff_max_s=4.0, clock=lambda: now[0])
    sup.check_once()  # first start: fails
    h = sup.health()[GPU_A.uuid]
    assert not h["healthy"] and h["restarts"] == 0 and h["message"].startswith("start failed: '-d' exit 1")
    attempts = [0]
    for advance in (0.5, 0.5, 1.0, 1.0, 2.0, 4.0, 4.0):  # backoff 1, 2, 4, 4 (capped)
        now[0] += advance
        sup.check_once()
        attempts.append(sup.health()[GPU_A.uuid]["restarts"])
    assert attempts == [0, 0, 1, 1, 2, 2, 3, 4]
    flag.unlink()
    now[0] += 4.0
    sup.check_once()
    assert sup.health()[GPU_A.uuid] == {"healthy": True, "restarts": 5, "message": "running (restart 5)"}
    sup.stop()
    assert not (root / GPU_A.uuid / "pipe" / PID_FILE).exists()


def test_waits_for_a_slow_daemon(root: Path, control: str) -> None:
    sup = supervisor(root, control, [GPU_A], env={**os.environ, "FAKE_MPS_START_DELAY_S": "0.4"})
    sup.check_once()
    try:
        assert sup.health()[GPU_A.uuid]["healthy"]
        assert "cmd set_default_device_pinned_mem_limit 0 20389M" in log_lines(root, GPU_A.uuid)
    finally:
        sup.stop()


def test_missing_control_program_is_reported(root: Path, tmp_path: Path) -> None:
    sup = supervisor(root, str(tmp_path / "no-such-mps-control"), [GPU_A])
    sup.check_once()
    h = sup.health()[GPU_A.uuid]
    assert not h["healthy"] and "cannot run" in h["message"]
    sup.stop()


def test_limits_and_thread_percentage() -> None:
    sup = MpsSupervisor(root="/run/x", gpus=[], thread_percentage=30, limit_device="uuid")
    assert sup.limits(GPU_A) == ["set_default_device_pinned_mem_limit GPU-aaaa 20389M",
                                 "set_default_active_thread_percentage 30"]
    assert sup.limits(GPU_B) == ["set_default_active_thread_percentage 30"]
    assert thread_percentage("auto", 3) == 33 and thread_percentage("auto", None) is None
    assert thread_percentage(None, 4) is None and thread_percentage(50, None) == 50
    assert MpsSupervisor(root="/run/x", gpus=[]).limits(GPU_A) == ["set_default_device_pinned_mem_limit 0 20389M"]


def test_mps_gpus_from_the_annotation() -> None:
    value = [{"index": 0, "uuid": "GPU-m", "mode": "mig", "memory_mib": 81920, "mig": []},
             {"index": 1, "uuid": "GPU-p", "mode": "mps", "replicas": 4, "memory_mib": 81559},
             {"index": 2, "uuid": "GPU-q", "mode": "mps", "memory_mib": 15360},
             {"index": 3, "uuid": "GPU-t", "mode": "timeslice", "replicas": 2, "memory_mib": 15360}]
    assert mps_gpus(value) == [MpsGpu(1, "GPU-p", 4, 81559), MpsGpu(2, "GPU-q", None, 15360)]
