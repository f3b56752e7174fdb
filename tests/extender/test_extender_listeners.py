"""`vramfit serve` as a process with its three listeners: verbs behind kube-scheduler's client certificate,
the webhook over HTTPS without one (the API server sends none), health and metrics on a plain port."""

from __future__ import annotations

import shutil
import signal
import socket
import ssl
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml
from serve_process import wait_ready

from extender.listeners import plan

ROOT = Path(__file__).resolve().parents[2]
NODE = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "annotations": {"vramfit.io/gpus": (
    '[{"index":0,"product":"Tesla-T4","memory_mib":15360,"mode":"exclusive"}]')}},
        "status": {"allocatable": {"vramfit.io/gpu": "1"}}}  # the node agent runs there
POD = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "default", "uid": "u1"},
       "spec": {"containers": [{"name": "c", "resources": {"limits": {"vramfit.io/vram": "4096"}}}]}}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _pki(d: Path) -> None:
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout",
             "ca.key", "-out", "ca.crt", "-days", "2", "-subj", "/CN=vramfit-ca", cwd=d)
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    for who in ("server", "scheduler", "stranger"):
        ca = ("ca.crt", "ca.key") if who != "stranger" else ("other.crt", "other.key")
        if who == "stranger":
            _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                     "-keyout", "other.key", "-out", "other.crt", "-days", "2", "-subj", "/CN=other-ca", cwd=d)
        _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout",
                 f"{who}.key", "-out", f"{who}.csr", "-subj", f"/CN={who}", cwd=d)
        _openssl("x509", "-req", "-in", f"{who}.csr", "-CA", ca[0], "-CAkey", ca[1], "-CAcreateserial",
                 "-out", f"{who}.crt", "-days", "2", "-extfile", "san.ext", cwd=d)


def test_plan_gives_each_path_one_home() -> None:
    listeners = plan(port=1, webhook_port=2, health_port=3, url_prefix="/vramfit", main_ssl={"a": 1},
                     webhook_ssl={"b": 2})
    by = {lis.name: lis for lis in listeners}
    for path, home in [("/vramfit/filter", "main"), ("/state", "main"), ("/mutate", "webhook"),
                       ("/vramfit/mutate", "webhook"), ("/healthz", "health"), ("/metrics", "health")]:
        assert [n for n, lis in by.items() if lis.allow(path)] == [home], path
    with pytest.raises(ValueError, match="must differ"):
        plan(port=1, webhook_port=1, health_port=None, url_prefix="", main_ssl={}, webhook_ssl={})
    with pytest.raises(ValueError, match="HTTPS"):
        plan(port=1, webhook_port=2, health_port=None, url_prefix="", main_ssl={}, webhook_ssl={})


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl CLI not available")
def test_three_listeners_with_client_certificates(tmp_path: Path) -> None:
    _pki(tmp_path)
    snap = tmp_path / "cluster.yaml"
    snap.write_text(yaml.safe_dump_all([NODE]))
    cfg = tmp_path / "config.yaml"
    cfg.write_text("url_prefix: /vramfit\n")
    main, hook, health = _free_port(), _free_port(), _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "vramfit.cli", "serve", "--snapshot", str(snap), "--config", str(cfg),
         "--port", str(main), "--webhook-port", str(hook), "--health-port", str(health),
         "--tls-cert", str(tmp_path / "server.crt"), "--tls-key", str(tmp_path / "server.key"),
         "--client-ca", str(tmp_path / "ca.crt"), "--log-level", "warning"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        wait_ready(proc, f"http://127.0.0.1:{health}/readyz")
        assert httpx.get(f"http://127.0.0.1:{health}/metrics").status_code == 200
        assert httpx.post(f"http://127.0.0.1:{health}/vramfit/filter", json={}).status_code == 404

        def client(who: str | None) -> httpx.Client:
            ctx = ssl.create_default_context(cafile=str(tmp_path / "ca.crt"))
            if who:
                ctx.load_cert_chain(str(tmp_path / f"{who}.crt"), str(tmp_path / f"{who}.key"))
            return httpx.Client(verify=ctx, timeout=5)

        body = {"Pod": POD, "NodeNames": ["n1"]}
        with client("scheduler") as c:
            assert c.post(f"https://127.0.0.1:{main}/vramfit/filter", json=body).json()["NodeNames"] == ["n1"]
            assert c.get(f"https://127.0.0.1:{main}/healthz").status_code == 404  # probes have their own port
        for who in (None, "stranger"):  # no certificate, or one from another CA: the handshake fails
            with client(who) as c, pytest.raises(httpx.HTTPError):
                c.post(f"https://127.0.0.1:{main}/vramfit/filter", json=body)
        review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                  "request": {"uid": "r1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                              "resource": {"group": "", "version": "v1", "resource": "pods"},
                              "namespace": "default", "operation": "CREATE", "object": POD}}
        with client(None) as c:  # the API server presents no client certificate
            answer = c.post(f"https://127.0.0.1:{hook}/mutate", json=review).json()["response"]
            assert answer["uid"] == "r1" and answer["allowed"] is True
            assert c.post(f"https://127.0.0.1:{hook}/vramfit/filter", json=body).status_code == 404
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(15)  # every listener stops on one signal
        if proc.stdout:
            proc.stdout.close()
