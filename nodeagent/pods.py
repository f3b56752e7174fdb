"""The pods bound to this node, as raw API JSON: from the API server (list+watch) or a snapshot file.

Allocate reads the cached view first; the watch may lag the kubelet (the kubelet learns of a binding from
its own watch), so `refresh()` re-reads the source directly. The agent reads pods only: it never writes them.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any, Protocol

from kubernetes import client as kclient

from kubeio.client import check_status, read_json
from kubeio.files import read_yaml_documents
from kubeio.reflector import Reflector
from packing.k8s.demand import InputError, pod_key
from packing.k8s.snapshot import split_objects

log = logging.getLogger("vramfit.node.pods")


class PodSource(Protocol):
    def pods(self) -> list[dict[str, Any]]:
        """The cached pods bound to this node."""
        ...

    def refresh(self) -> list[dict[str, Any]]:
        """Read the source again now (bounded by the client's timeout) and return the pods."""
        ...


def _on_node(objs: list[dict[str, Any]], node_name: str) -> list[dict[str, Any]]:
    return [p for p in objs if isinstance(p, dict) and (p.get("spec") or {}).get("nodeName") == node_name]


class SnapshotPods:
    """Dry-run source: the Pod objects of a `kubectl get pods -A -o yaml` file; `refresh` re-reads the file,
    so a tool driving the dry run can append the pods it binds."""

    def __init__(self, path: str | Path, node_name: str) -> None:
        self.path = str(path)
        self.node_name = node_name
        self._pods = self._read()

    def _read(self) -> list[dict[str, Any]]:
        _, pods = split_objects(read_yaml_documents(self.path), self.path)
        return _on_node(pods, self.node_name)

    def pods(self) -> list[dict[str, Any]]:
        return list(self._pods)

    def refresh(self) -> list[dict[str, Any]]:
        self._pods = self._read()
        return list(self._pods)


class _NodePods:
    """ClusterSink for one reflector: the node's pods by key."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.by_key: dict[str, dict[str, Any]] = {}
        self.synced = threading.Event()

    def replace(self, kind: str, items: list[dict[str, Any]]) -> None:
        fresh: dict[str, dict[str, Any]] = {}
        for obj in items:
            try:
                fresh[pod_key(obj)] = obj
            except InputError:
                continue
        with self.lock:
            self.by_key = fresh
        self.synced.set()

    def apply(self, kind: str, event_type: str, obj: dict[str, Any]) -> None:
        try:
            key = pod_key(obj)
        except InputError:
            return
        with self.lock:
            if event_type == "DELETED":
                self.by_key.pop(key, None)
            else:
                self.by_key[key] = obj


class ApiPods:
    """Live source: a field-selected list+watch of `spec.nodeName=<node>` (the kubelet's own selector)."""

    def __init__(self, api: kclient.ApiClient, node_name: str, *, refresh_timeout_s: float = 3.0) -> None:
        self.node_name = node_name
        self.selector = f"spec.nodeName={node_name}"
        self.core = kclient.CoreV1Api(api)
        self.refresh_timeout_s = refresh_timeout_s
        self.sink = _NodePods()
        self.stop_event = threading.Event()
        self.reflector = Reflector("pods", api, self.sink, self.stop_event, field_selector=self.selector)
        self._thread: threading.Thread | None = None

    def start(self) -> ApiPods:
        self._thread = threading.Thread(target=self.reflector.run, name="node-pods", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.stop_event.set()
        self.reflector.close()

    def pods(self) -> list[dict[str, Any]]:
        with self.sink.lock:
            return list(self.sink.by_key.values())

    def refresh(self) -> list[dict[str, Any]]:
        resp = self.core.list_pod_for_all_namespaces(field_selector=self.selector, _preload_content=False,
                                                     _request_timeout=self.refresh_timeout_s)
        check_status(resp)
        body = read_json(resp)
        items = body.get("items") or []
        # Newer than the watch for these pods; the watch's later events overwrite them as usual.
        with self.sink.lock:
            for obj in items:
                try:
                    self.sink.by_key[pod_key(obj)] = obj
                except InputError:
                    continue
        return _on_node(items, self.node_name)

