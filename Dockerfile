# safetynet daemon image: slim Python, non-root, `safetynet run` as the entrypoint.
#
# The base is an exact patch tag of the slim Debian (bookworm) Python image. To bump it:
# change the tag to the newest 3.11.x-slim-bookworm, rebuild, run the tests. The deploying
# pipeline pins the digest it resolved itself, reading it from the registry (e.g.
# `docker buildx imagetools inspect python:3.11.17-slim-bookworm`) and building with
# `FROM python:3.11.17-slim-bookworm@sha256:<that digest>`; never write a digest here
# that was not read from the registry.
FROM python:3.11.17-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    SAFETYNET_CONFIG=/etc/safetynet/config.toml

WORKDIR /opt/safetynet
# The runtime dependencies and the build backend, each at the version and hashes of the
# lock (see `make lock`), in a layer of their own; then the project without dependencies.
COPY requirements/runtime.lock ./requirements/
RUN pip install --no-cache-dir --require-hashes -r requirements/runtime.lock
COPY pyproject.toml README.md ./
COPY actors ./actors
COPY supervision ./supervision
RUN pip install --no-cache-dir --no-deps --no-build-isolation . \
    && useradd --system --uid 10001 --no-create-home safetynet \
    && mkdir -p /etc/safetynet

# No configuration is baked in: mount one at /etc/safetynet/config.toml (on Kubernetes the
# ConfigMap of deploy/kubernetes/configmap.yaml) and pass secrets as SAFETYNET__* variables.
# A baked example would either fail its own check (it names no secrets) or run a daemon
# against a database nobody chose; tests/unit/house/test_deploy.py runs `safetynet check-config`
# on any configuration this file copies in.

USER 10001
# /metrics, /healthz, /readyz (set http.listen = "0.0.0.0:9464" in the mounted config
# to expose them outside the container; the default binds loopback only).
EXPOSE 9464
HEALTHCHECK --interval=15s --timeout=3s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:9464/healthz', timeout=2).status == 200 else 1)"]

ENTRYPOINT ["safetynet"]
CMD ["run", "-c", "/etc/safetynet/config.toml"]
