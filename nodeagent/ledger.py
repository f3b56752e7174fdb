"""What the agent answered, per pod and container: the memory that makes Allocate safe across restarts.

A pod counts as answered once every container of it that asks for `vramfit.io/gpu` was answered, so a
second Allocate naming the same pod is refused instead of handing its units out twice. The ledger is
written to a file (atomically, after every answer) so an agent restart between an answer and the kubelet's
admission does not forget it; the kubelet itself never re-Allocates a container it checkpointed.
Reconciliation compares the ledger with the kubelet's pod-resources view.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from nodeagent.allocate import HandedOut, containers_answered

log = logging.getLogger("vramfit.node.ledger")

KEEP = 4096  # answers kept (far more than the pods a node runs at once)


@dataclass(frozen=True)
class Answer:
    uid: str
    pod: str  # namespace/name
    container: str
    device_ids: tuple[str, ...]
    units: tuple[str, ...]
    at: float
    vram_mib: tuple[int, ...] = ()  # per unit; empty in ledgers written before it was kept


class Ledger:
    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path) if path else None
        self._lock = threading.Lock()
        self._answers: list[Answer] = []
        if self.path is not None and self.path.exists():
            self._load()

    def _load(self) -> None:
        assert self.path is not None
        try:
            doc = json.loads(self.path.read_text(encoding="utf-8"))
            self._answers = [Answer(uid=a["uid"], pod=a["pod"], container=a["container"],
                                    device_ids=tuple(a["device_ids"]), units=tuple(a["units"]), at=float(a["at"]),
                                    vram_mib=tuple(int(v) for v in a.get("vram_mib") or ()))
                             for a in doc.get("answers", [])]
        except (OSError, ValueError, KeyError, TypeError) as err:
            # A broken file must not stop the agent; the kubelet's checkpoint still guards re-allocation.
            log.error("ignoring unreadable ledger %s: %s", self.path, err)
            self._answers = []

    def _save(self) -> None:
        if self.path is None:
            return
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"answers": [asdict(a) for a in self._answers]}), encoding="utf-8")
        os.replace(tmp, self.path)

    def record(self, uid: str, pod: str, container: str, device_ids: list[str], units: tuple[str, ...],
               vram_mib: tuple[int, ...] = ()) -> None:
        with self._lock:
            self._answers.append(Answer(uid, pod, container, tuple(device_ids), tuple(units), time.time(),
                                        tuple(vram_mib)))
            del self._answers[:-KEEP]
            self._save()

    def answered(self) -> dict[str, int]:
        """Pod UID -> containers answered."""
        return containers_answered(self.handed_out())

    def handed_out(self) -> list[HandedOut]:
        """Every answer as the Allocate rule reads it (which pod got which units)."""
        with self._lock:
            return [HandedOut(a.uid, a.pod, a.units, a.vram_mib) for a in self._answers]

    def answers(self) -> list[Answer]:
        with self._lock:
            return list(self._answers)

    def by_container(self) -> dict[tuple[str, str], Answer]:
        """(namespace/name, container) -> the latest answer for it."""
        with self._lock:
            return {(a.pod, a.container): a for a in self._answers}
