"""The extender's cluster source: one list+watch reflector per kind (`kubeio.reflector`) feeding the store.

The store is ready once every kind has completed one full list. A new leadership term asks for a fresh list of
every kind (`KubeSource.resync`); while it waits, a failing list is retried with a shorter backoff cap, and each
reflector says since when its list fails and why (the readiness message).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from kubernetes import client as kclient

from kubeio.reflector import KINDS, Backoff, ClusterSink, Reflector


class KubeSource:
    """Runs one reflector per kind in daemon threads; `ready` is set once every kind was listed."""

    def __init__(self, api: kclient.ApiClient, sink: ClusterSink, *, watch_timeout_s: int = 300,
                 backoff: Callable[[], Backoff] | None = None, kinds: tuple[str, ...] = KINDS) -> None:
        """`kinds`: KINDS, plus `kubeio.reflector.DRA_KINDS` when DRA allocation is on."""
        self.stop_event = threading.Event()
        self.kinds = kinds
        self._synced: set[str] = set()
        self._synced_lock = threading.Lock()
        self.ready = threading.Event()
        self.reflectors = {
            kind: Reflector(kind, api, sink, self.stop_event, on_synced=self._mark_synced,
                            watch_timeout_s=watch_timeout_s, backoff=backoff() if backoff else None)
            for kind in kinds
        }
        self._threads: list[threading.Thread] = []

    def _mark_synced(self, kind: str) -> None:
        with self._synced_lock:
            self._synced.add(kind)
            if self._synced >= set(self.kinds):
                self.ready.set()

    def resync(self, timeout_s: float = 30.0, *, retry_cap_s: float | None = None,
               still_wanted: Callable[[], bool] = lambda: True) -> list[str]:
        """Re-list every kind now and wait until each list is in the store (a new leadership term), at most
        `timeout_s` and while `still_wanted()`. A failed list is retried with the reflector's backoff capped at
        `retry_cap_s` meanwhile. Returns the kinds not re-listed (empty: done)."""
        before = self.list_counts()
        for r in self.reflectors.values():
            r.retry_cap_s = retry_cap_s
            r.request_relist()
        try:
            return self.wait_listed(before, timeout_s, still_wanted)
        finally:
            for r in self.reflectors.values():
                r.retry_cap_s = None

    def list_counts(self) -> dict[str, int]:
        return {kind: r.lists for kind, r in self.reflectors.items()}

    def wait_listed(self, before: dict[str, int], timeout_s: float,
                    still_wanted: Callable[[], bool] = lambda: True) -> list[str]:
        """Wait until every kind has listed since the counts `before`; returns the kinds that have not."""
        deadline = time.monotonic() + timeout_s
        while True:
            behind = [kind for kind, r in self.reflectors.items() if r.lists <= before.get(kind, -1)]
            if not behind or self.stop_event.wait(0.02) or time.monotonic() > deadline or not still_wanted():
                return behind

    def failures(self) -> list[str]:
        """Each kind whose list fails now: what and since when."""
        now = time.monotonic()
        return [f for r in self.reflectors.values() if (f := r.failure(now)) is not None]

    def relisting(self) -> list[str]:
        """The kinds asked to re-list that have not yet."""
        return [kind for kind, r in self.reflectors.items() if r.relist_pending]

    def not_listed(self) -> str | None:
        """Why the store is not ready yet (kinds never listed, and their failures); None once it is."""
        if self.ready.is_set():
            return None
        with self._synced_lock:
            missing = [kind for kind in self.reflectors if kind not in self._synced]
        failing = [f for kind in missing if (f := self.reflectors[kind].failure()) is not None]
        return f"{', '.join(missing)} not listed yet" + (f" ({'; '.join(failing)})" if failing else "")

    def start(self) -> KubeSource:
        for kind, refl in self.reflectors.items():
            t = threading.Thread(target=refl.run, name=f"reflector-{kind}", daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        self.stop_event.set()
        for refl in self.reflectors.values():
            refl.close()  # also ends a backoff wait
        for t in self._threads:
            t.join(timeout=timeout_s)
