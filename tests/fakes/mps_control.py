"""A stand-in for `nvidia-cuda-mps-control`, enough for the agent's MPS supervisor tests.

Run as `python mps_control.py [-d]` (tests wrap it in a small shell script used as the control path).

- `-d`: forks a background daemon and returns at once, as the real one does. The daemon writes
  `<CUDA_MPS_PIPE_DIRECTORY>/nvidia-cuda-mps-control.pid` and a `control` file (the real one makes a named
  pipe there), logs `start pid=<pid> CUDA_VISIBLE_DEVICES=<value>` to `<CUDA_MPS_LOG_DIRECTORY>/control.log`,
  and runs until SIGTERM. Refuses (exit 1) while a live daemon already owns the pid file.
- no argument: client mode. Reads commands on stdin, logs each as `cmd <command>` to control.log and answers
  it when the daemon of that pipe directory is alive; exits 1 ("Cannot find MPS control daemon process")
  otherwise. `quit` stops the daemon and waits for it to go.

Knobs for tests (environment): FAKE_MPS_START_DELAY_S delays the daemon's pid file (to exercise the wait for
readiness); FAKE_MPS_FAIL_START=1 makes `-d` fail, and so does FAKE_MPS_FAIL_START_FILE=<path> while that
file exists.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

PID_FILE = "nvidia-cuda-mps-control.pid"
STATE_FILE = "fake-state.json"


def _dirs() -> tuple[Path, Path]:
    pipe = Path(os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps"))
    log = Path(os.environ.get("CUDA_MPS_LOG_DIRECTORY", "/var/log/nvidia-mps"))
    return pipe, log


def _log(log: Path, line: str) -> None:
    log.mkdir(parents=True, exist_ok=True)
    with (log / "control.log").open("a", encoding="utf-8") as fh:
        fh.write(line + "\n")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A killed daemon whose new parent does not reap it stays a zombie: kill(0) succeeds, but it is dead.
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def _daemon_pid(pipe: Path) -> int | None:
    try:
        pid = int((pipe / PID_FILE).read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if _alive(pid) else None


def _run_daemon(pipe: Path, log: Path) -> None:
    """The forked daemon: detach, publish pid and control file, wait for SIGTERM."""
    os.setsid()
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)

    def finish(_signum: int, _frame: object) -> None:
        for name in ("control", PID_FILE):
            (pipe / name).unlink(missing_ok=True)
        _log(log, f"exit pid={os.getpid()}")
        os._exit(0)

    signal.signal(signal.SIGTERM, finish)
    time.sleep(float(os.environ.get("FAKE_MPS_START_DELAY_S", "0")))
    (pipe / "control").write_text("")
    tmp = pipe / f".{PID_FILE}.tmp"
    tmp.write_text(str(os.getpid()))
    tmp.replace(pipe / PID_FILE)
    _log(log, f"start pid={os.getpid()} CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '')}")
    while True:
        signal.pause()


def start_daemon() -> int:
    pipe, log = _dirs()
    fail_file = os.environ.get("FAKE_MPS_FAIL_START_FILE")
    if os.environ.get("FAKE_MPS_FAIL_START") == "1" or (fail_file and Path(fail_file).exists()):
        print("fake: start refused (FAKE_MPS_FAIL_START)", file=sys.stderr)
        return 1
    pipe.mkdir(parents=True, exist_ok=True)
    if _daemon_pid(pipe) is not None:
        print("An instance of this daemon is already running", file=sys.stderr)
        return 1
    if os.fork() == 0:
        try:
            _run_daemon(pipe, log)
        finally:
            os._exit(1)
    return 0  # the launcher returns at once; the daemon finishes starting in the background


def _state(pipe: Path) -> dict[str, object]:
    try:
        return json.loads((pipe / STATE_FILE).read_text())
    except (OSError, ValueError):
        return {"active_thread_percentage": 100.0, "pinned_mem_limits": {}}


def _answer(pipe: Path, pid: int, command: str) -> str:
    words = command.split()
    state = _state(pipe)
    if words == ["get_default_active_thread_percentage"]:
        return f"{float(str(state['active_thread_percentage'])):.1f}"
    if len(words) == 2 and words[0] == "set_default_active_thread_percentage":
        state["active_thread_percentage"] = float(words[1])
    elif len(words) == 3 and words[0] == "set_default_device_pinned_mem_limit":
        limits = dict(state["pinned_mem_limits"])  # type: ignore[call-overload]
        limits[words[1]] = words[2]
        state["pinned_mem_limits"] = limits
    elif words == ["get_server_list"]:
        return ""
    elif words == ["quit"]:
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 5
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        return ""
    else:
        return "Unrecognized command"
    (pipe / STATE_FILE).write_text(json.dumps(state))
    return ""


def client() -> int:
    pipe, log = _dirs()
    pid = _daemon_pid(pipe)
    for raw in sys.stdin:
        command = raw.strip()
        if not command:
            continue
        _log(log, f"cmd {command}")
        if pid is None:
            print("Cannot find MPS control daemon process", file=sys.stderr)
            return 1
        answer = _answer(pipe, pid, command)
        if answer:
            print(answer)
    return 0


def main(argv: list[str]) -> int:
    if argv == ["-d"]:
        return start_daemon()
    if not argv:
        return client()
    print(f"usage: {Path(sys.argv[0]).name} [-d]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
