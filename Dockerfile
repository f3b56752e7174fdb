# syntax=docker/dockerfile:1
# One image for the extender (`vramfit serve`), the node agent (`vramfit node`) and the CLI.
#
#   docker build -t ghcr.io/vramfit/vramfit:0.1.0 --build-arg VCS_REF=$(git rev-parse HEAD) .
#
# The base is pinned by tag and by the digest of its multi-architecture index. The digest was taken from
# public Dockerfiles that pin the same tag (it could not be resolved against the registry from here): check
# it with `docker buildx imagetools inspect python:3.11.14-slim-bookworm` and update both together.
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm@sha256:65a93d69fa75478d554f4ad27c85c1e69fa184956261b4301ebaf6dbb0a3543d

# ---- builder: the wheel, then it and its dependencies into a venv ---------------------------------------
FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore
WORKDIR /src
# Only what the wheel is built from (.dockerignore keeps the rest of the tree, benchmarks and traces included,
# out of the context).
COPY pyproject.toml README.md LICENSE ./
COPY packing/ packing/
COPY kubeio/ kubeio/
COPY extender/ extender/
COPY nodeagent/ nodeagent/
COPY vramfit/ vramfit/
# Every dependency ships manylinux wheels (--only-binary): no compiler is needed, or installed, even here.
# pip compiles the installed modules to .pyc, so the read-only runtime never needs to write any.
RUN python -m pip wheel --no-deps --wheel-dir /wheels . \
 && python -m venv /opt/vramfit \
 && /opt/vramfit/bin/pip install --only-binary=:all: /wheels/vramfit-*.whl \
 && /opt/vramfit/bin/pip uninstall --yes pip setuptools wheel \
 && /opt/vramfit/bin/vramfit --help > /dev/null

# ---- runtime: the installed environment only ------------------------------------------------------------
FROM ${PYTHON_IMAGE}
ARG VERSION=0.1.0
ARG VCS_REF=unknown
ARG BUILD_DATE=unknown
LABEL org.opencontainers.image.title="vramfit" \
      org.opencontainers.image.description="kube-scheduler extender, admission webhook and node agent that place GPU pods by real VRAM across MIG, MPS, time-slicing and whole GPUs" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${VCS_REF}" \
      org.opencontainers.image.created="${BUILD_DATE}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/vramfit/vramfit" \
      org.opencontainers.image.url="https://github.com/vramfit/vramfit" \
      org.opencontainers.image.documentation="https://github.com/vramfit/vramfit/blob/main/manifests/README.md" \
      org.opencontainers.image.vendor="The vramfit authors" \
      org.opencontainers.image.base.name="docker.io/library/python:3.11.14-slim-bookworm"
# The base image's own pip/setuptools/wheel go too: nothing installs anything at run time. The user exists
# so tools that look it up find a name; it owns nothing, and its home does not exist.
RUN python -m pip uninstall --yes --root-user-action=ignore pip setuptools wheel \
 && rm -rf /root/.cache /usr/local/bin/pip* /usr/local/bin/idle* /usr/local/bin/pydoc* \
 && groupadd --gid 65532 nonroot \
 && useradd --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin nonroot
COPY --from=builder /opt/vramfit /opt/vramfit
# Read-only root filesystem: no .pyc written at run time (they were compiled at install); unbuffered logs.
ENV PATH=/opt/vramfit/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# The node agent's DaemonSet runs it as root (runAsUser: 0) for the kubelet's sockets; everything else as this.
USER 65532:65532
WORKDIR /
# 8888 verbs (mTLS), 8443 webhook, 8081 probes and metrics (extender); 9401 metrics (node agent)
EXPOSE 8888 8443 8081 9401
ENTRYPOINT ["vramfit"]
CMD ["--help"]
