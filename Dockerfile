# syntax=docker/dockerfile:1.7
#
# citewarden image: multi-stage, non-root (10001:10001), runs with a read-only root
# filesystem; /tmp is the only path it may write (mount an emptyDir / tmpfs there).
#
#   docker build -t citewarden:0.1.0 .
#   docker run --read-only --tmpfs /tmp --stop-timeout 30 -p 8080:8080 -p 9090:9090 \
#     -e CITEWARDEN_UPSTREAM=https://api.openai.com citewarden:0.1.0
#
# Policies from policies/*.yaml ship in /etc/citewarden/policies; the image starts with
# default.yaml. Mount your own directory there (or set CITEWARDEN_POLICY) to change them.

# Same base in both stages: the virtualenv's interpreter symlink points into it.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/citewarden
WORKDIR /src
# Dependencies first so code-only changes reuse the layer.
COPY pyproject.toml README.md ./
RUN --mount=type=cache,target=/root/.cache/pip \
    python -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))' > requirements.txt \
 && /opt/citewarden/bin/pip install -r requirements.txt
COPY gateway ./gateway
# Compile bytecode now: at runtime the filesystem is read-only and nothing may be cached.
RUN --mount=type=cache,target=/root/.cache/pip \
    /opt/citewarden/bin/pip install --no-deps . \
 && /opt/citewarden/bin/python -m compileall -q -j 0 /opt/citewarden/lib


FROM ${PYTHON_IMAGE} AS runtime
LABEL org.opencontainers.image.title="citewarden" \
      org.opencontainers.image.description="Reverse proxy that releases LLM/RAG answers only when their citations verify"

# The official images strip the stdlib's .pyc files; without them every start recompiles
# the stdlib in memory because the read-only root filesystem cannot cache it.
RUN python -m compileall -q -j 0 "$(python -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')" \
 && groupadd --system --gid 10001 citewarden \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin citewarden

COPY --from=build /opt/citewarden /opt/citewarden
COPY policies/*.yaml /etc/citewarden/policies/

ENV PATH=/opt/citewarden/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    TMPDIR=/tmp \
    CITEWARDEN_HOST=0.0.0.0 \
    CITEWARDEN_PORT=8080 \
    CITEWARDEN_ADMIN_PORT=9090 \
    CITEWARDEN_POLICY=/etc/citewarden/policies/default.yaml

# Numeric, so Kubernetes can verify runAsNonRoot without resolving a user name.
USER 10001:10001
WORKDIR /tmp
EXPOSE 8080 9090

# No curl in slim images: probe the admin port with the interpreter we already have.
HEALTHCHECK --interval=15s --timeout=3s --start-period=10s --retries=3 \
    CMD ["python", "-c", "import os, sys, urllib.request; port = os.environ.get('CITEWARDEN_ADMIN_PORT', '9090'); sys.exit(0 if urllib.request.urlopen(f'http://127.0.0.1:{port}/healthz', timeout=2).status == 200 else 1)"]

# SIGTERM (docker stop, Kubernetes) drains in-flight requests for CITEWARDEN_SHUTDOWN_GRACE
# seconds (default 20): give `docker stop` / terminationGracePeriodSeconds more than that.
STOPSIGNAL SIGTERM
ENTRYPOINT ["citewarden", "serve"]
