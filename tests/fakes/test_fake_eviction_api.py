"""The eviction stand-in answers as EvictionREST.Create does (pkg/registry/core/pod/storage/eviction.go)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from fakes.apiserver import FakeApiServer
from fakes.eviction_api import set_pdb_blocks


def _pod(phase: str) -> dict[str, Any]:
    return {"metadata": {"name": "p", "namespace": "ns", "uid": "u1"}, "spec": {"nodeName": "n"},
            "status": {"phase": phase}}


def _evict(fake: FakeApiServer, uid: str) -> tuple[int, Any]:
    body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "p", "namespace": "ns"},
            "deleteOptions": {"preconditions": {"uid": uid}}}
    req = urllib.request.Request(f"{fake.url}/api/v1/namespaces/ns/pods/p/eviction", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_the_pdb_is_checked_before_the_uid_precondition_and_skipped_for_pending_pods() -> None:
    fake = FakeApiServer(pods=[_pod("Running")]).start()
    try:
        set_pdb_blocks(fake, lambda ns, name: True, "web")
        code, body = _evict(fake, "stale")
        assert code == 429 and body["reason"] == "TooManyRequests"
        assert body["details"]["causes"][0] == {"reason": "DisruptionBudget",
                                                "message": "The disruption budget web needs 1 healthy pods and has "
                                                           "1 currently"}
        fake.set_pod_status("ns", "p", phase="Pending")
        code, body = _evict(fake, "stale")
        assert code == 409 and body["message"].startswith('Operation cannot be fulfilled on Pod "p": the UID in the '
                                                          "precondition (stale) does not match the UID in record (u1)")
        code, body = _evict(fake, "u1")
        assert (code, body["status"], body["code"]) == (201, "Success", 201)
        code, body = _evict(fake, "u1")
        assert code == 404 and body["message"] == 'pods "p" not found'
    finally:
        fake.stop()
