"""One CUDA MPS control daemon per MPS GPU, started and kept alive by the agent.

Layout (as NVIDIA's device plugin keeps it under /run/nvidia/mps, but per GPU rather than per resource):
`<root>/<uuid>/pipe` and `<root>/<uuid>/log`. Each daemon sees only its GPU (`CUDA_VISIBLE_DEVICES=<uuid>`),
so a client that mounts that pipe directory reaches that GPU's MPS server and no other.

`nvidia-cuda-mps-control -d` daemonises: the process we launch exits at once, so "our child is alive" says
nothing. Health is checked the way NVIDIA's mps-control-daemon does it (cmd/mps-control-daemon/mps/daemon.go
`AssertHealthy`): run the control program in client mode with the same pipe directory and send
`get_default_active_thread_percentage` on stdin; it exits non-zero when no daemon answers on that pipe.

After a start, the per-client defaults are set through the same client mode, as NVIDIA's daemon does:
`set_default_device_pinned_mem_limit <dev> <floor(memory_mib / replicas)>M` and
`set_default_active_thread_percentage <pct>` (gpu-facts.md §2). Unlike NVIDIA's daemon the agent does not
switch the GPU's compute mode to EXCLUSIVE_PROCESS: it changes no GPU setting (that stays the operator's).
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

ThreadPercentage = int | Literal["auto"] | None
HEALTH_COMMAND = "get_default_active_thread_percentage"


class MpsError(RuntimeError):
    """A control command failed (no daemon on the pipe, non-zero exit, timeout)."""


@dataclass(frozen=True)
class MpsGpu:
    index: int
    uuid: str
    replicas: int | None  # None: no equal split; per-pod limits come with each client's environment
    memory_mib: int


def mps_gpus(gpus_annotation: Iterable[Mapping[str, Any]]) -> list[MpsGpu]:
    """The MPS GPUs of a `vramfit.io/gpus` value."""
    return [MpsGpu(index=int(g["index"]), uuid=str(g["uuid"]), replicas=g.get("replicas"),
                   memory_mib=int(g["memory_mib"]))
            for g in gpus_annotation if g.get("mode") == "mps" and g.get("uuid")]


def thread_percentage(setting: ThreadPercentage, replicas: int | None) -> int | None:
    """The default active thread percentage: an int as given, "auto" = 100 // replicas (NVIDIA's rule)."""
    if setting == "auto":
        return max(1, 100 // replicas) if replicas else None
    return setting if isinstance(setting, int) else None


def pipe_dir(root: str | Path, uuid: str) -> str:
    """Where the GPU's control daemon keeps its pipes (mounted into each MPS client)."""
    return str(Path(root) / uuid / "pipe")


@dataclass
class _State:
    gpu: MpsGpu
    healthy: bool = False
    started: bool = False  # a start was attempted at least once: later starts count as restarts
    restarts: int = 0
    failures: int = 0  # consecutive failed checks/starts, for the backoff
    next_start: float = 0.0
    message: str = "not started"


class MpsSupervisor:
    """Start, watch, restart (with backoff) and stop one control daemon per GPU."""

    def __init__(self, *, root: str | Path, gpus: Iterable[MpsGpu],
                 control_path: str = "nvidia-cuda-mps-control",
                 thread_percentage: ThreadPercentage = None,
                 poll_interval_s: float = 5.0,
                 command_timeout_s: float = 10.0,
                 ready_timeout_s: float = 10.0,
                 backoff_initial_s: float = 1.0,
                 backoff_max_s: float = 60.0,
                 limit_device: Literal["ordinal", "uuid"] = "ordinal",
                 clock: Callable[[], float] = time.monotonic,
                 env: Mapping[str, str] | None = None) -> None:
        self.root = Path(root)
        self.control_path = control_path
        self.thread_setting = thread_percentage
        self.poll_interval_s = poll_interval_s
        self.command_timeout_s = command_timeout_s
        self.ready_timeout_s = ready_timeout_s
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self.limit_device = limit_device
        self.clock = clock
        self._base_env = dict(os.environ if env is None else env)
        self._states = {g.uuid: _State(gpu=g) for g in gpus}
        self._lock = threading.Lock()
        self._pass = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- paths and client environment --------------------------------------------------------------------------

    def pipe_dir(self, uuid: str) -> str:
        return pipe_dir(self.root, uuid)

    def log_dir(self, uuid: str) -> str:
        return str(self.root / uuid / "log")

    def pipe_dirs(self) -> dict[str, str]:
        """UUID -> pipe directory of the daemons that answer now (Allocate mounts it into the container)."""
        with self._lock:
            return {u: self.pipe_dir(u) for u, s in self._states.items() if s.healthy}

    def client_env(self, uuid: str) -> dict[str, str]:
        return {"CUDA_MPS_PIPE_DIRECTORY": self.pipe_dir(uuid), "CUDA_MPS_LOG_DIRECTORY": self.log_dir(uuid)}

    def _env(self, uuid: str) -> dict[str, str]:
        env = dict(self._base_env)
        env.update(self.client_env(uuid))
        env["CUDA_VISIBLE_DEVICES"] = uuid  # the daemon (and its server) sees this GPU only
        return env

    # -- control commands --------------------------------------------------------------------------------------

    def command(self, uuid: str, text: str) -> str:
        """Send one command to the GPU's daemon (`echo text | nvidia-cuda-mps-control`); its answer."""
        try:
            done = subprocess.run([self.control_path], input=text + "\n", capture_output=True, text=True,
                                  env=self._env(uuid), timeout=self.command_timeout_s, check=False)
        except subprocess.TimeoutExpired:
            raise MpsError(f"{text!r}: no answer within {self.command_timeout_s:g}s") from None
        except OSError as exc:
            raise MpsError(f"cannot run {self.control_path}: {exc.strerror or exc}") from None
        if done.returncode != 0:
            detail = (done.stderr or done.stdout).strip().splitlines()
            raise MpsError(f"{text!r}: exit {done.returncode}" + (f": {detail[-1]}" if detail else ""))
        return done.stdout

    def check(self, uuid: str) -> None:
        """Raises MpsError unless the GPU's daemon answers (NVIDIA's AssertHealthy)."""
        self.command(uuid, HEALTH_COMMAND)

    def limits(self, gpu: MpsGpu) -> list[str]:
        """The default-limit commands for a GPU's daemon."""
        out = []
        if gpu.replicas:
            # The daemon sees one GPU: ordinal 0 (MPS remaps ordinals under CUDA_VISIBLE_DEVICES). NVIDIA's
            # daemon sends the NVML index because it exposes all GPUs; the UUID form is an option, unverified
            # for this command (the docs only say "<dev>").
            dev = "0" if self.limit_device == "ordinal" else gpu.uuid
            out.append(f"set_default_device_pinned_mem_limit {dev} {gpu.memory_mib // gpu.replicas}M")
        pct = thread_percentage(self.thread_setting, gpu.replicas)
        if pct is not None:
            out.append(f"set_default_active_thread_percentage {pct}")
        return out

    # -- lifecycle ---------------------------------------------------------------------------------------------

    def _launch(self, gpu: MpsGpu) -> None:
        """Start the daemon, wait until it answers, set its defaults. Raises MpsError."""
        Path(self.pipe_dir(gpu.uuid)).mkdir(parents=True, exist_ok=True)
        Path(self.log_dir(gpu.uuid)).mkdir(parents=True, exist_ok=True)
        # Output goes to a file, not a pipe: the daemonised grandchild may keep inherited descriptors open,
        # and reading a pipe to EOF would then wait for the daemon to exit.
        with tempfile.TemporaryFile(mode="w+") as out:
            try:
                code = subprocess.call([self.control_path, "-d"], stdin=subprocess.DEVNULL, stdout=out,
                                       stderr=subprocess.STDOUT, env=self._env(gpu.uuid),
                                       timeout=self.command_timeout_s, start_new_session=True)
            except subprocess.TimeoutExpired:
                raise MpsError(f"'-d' did not return within {self.command_timeout_s:g}s") from None
            except OSError as exc:
                raise MpsError(f"cannot run {self.control_path}: {exc.strerror or exc}") from None
            if code != 0:
                out.seek(0)
                tail = out.read().strip().splitlines()
                raise MpsError(f"'-d' exit {code}" + (f": {tail[-1]}" if tail else ""))
        self._wait_ready(gpu.uuid)
        for cmd in self.limits(gpu):
            self.command(gpu.uuid, cmd)

    def _wait_ready(self, uuid: str) -> None:
        # The launcher returns before the daemon has its pipe: poll the health command until it answers.
        deadline = time.monotonic() + self.ready_timeout_s
        while True:
            try:
                self.check(uuid)
                return
            except MpsError as exc:
                if time.monotonic() >= deadline:
                    raise MpsError(f"daemon not answering {self.ready_timeout_s:g}s after start: {exc}") from None
            time.sleep(min(0.05, self.ready_timeout_s))

    def _backoff(self, failures: int) -> float:
        return min(self.backoff_max_s, self.backoff_initial_s * 2 ** max(0, failures - 1))

    # Only one pass at a time touches the daemons (`_pass`); `_lock` guards the state that health() and
    # pipe_dirs() read, and is never held across a subprocess, so Allocate never waits for a restart.

    def _update(self, state: _State, **fields: Any) -> None:
        with self._lock:
            for name, value in fields.items():
                setattr(state, name, value)

    def _start_one(self, state: _State) -> None:
        restarts = state.restarts + 1 if state.started else state.restarts
        if state.started:
            # Best effort: a daemon that is alive but not answering would block the new one on its pid file.
            try:
                self.command(state.gpu.uuid, "quit")
            except MpsError:
                pass
        self._update(state, started=True, restarts=restarts)
        try:
            self._launch(state.gpu)
        except MpsError as exc:
            failures = state.failures + 1
            self._update(state, healthy=False, failures=failures, message=f"start failed: {exc}",
                         next_start=self.clock() + self._backoff(failures))
            return
        self._update(state, healthy=True, failures=0,
                     message="running" + (f" (restart {restarts})" if restarts else ""))

    def _supervise(self, state: _State) -> None:
        if state.started and state.healthy:
            try:
                self.check(state.gpu.uuid)
                return
            except MpsError as exc:
                # The first restart is immediate; the backoff applies to failed starts after it.
                self._update(state, healthy=False, failures=state.failures + 1,
                             message=f"not answering: {exc}", next_start=self.clock())
        if self.clock() >= state.next_start:
            self._start_one(state)

    def check_once(self) -> None:
        """One supervision pass: check every daemon, (re)start those that fail and whose backoff expired."""
        with self._pass:
            for state in self._states.values():
                if self._stop.is_set():
                    return
                self._supervise(state)

    def start(self) -> None:
        """Start every daemon once (synchronously), then supervise in a background thread."""
        self._stop.clear()
        self.check_once()
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="vramfit-mps", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.poll_interval_s):
            self.check_once()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop supervising and send `quit` to every daemon."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None
        with self._pass:
            for state in self._states.values():
                if not state.started:
                    continue
                try:
                    self.command(state.gpu.uuid, "quit")
                    message = "stopped"
                except MpsError as exc:
                    message = f"quit failed: {exc}"
                self._update(state, healthy=False, started=False, message=message)

    def health(self) -> dict[str, dict[str, Any]]:
        """UUID -> {"healthy", "restarts", "message"}."""
        with self._lock:
            return {u: {"healthy": s.healthy, "restarts": s.restarts, "message": s.message}
                    for u, s in self._states.items()}
