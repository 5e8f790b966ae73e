# safetynet daemon image: slim Python, non-root, `safetynet run` as the entrypoint.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    SAFETYNET_CONFIG=/etc/safetynet/config.toml

WORKDIR /opt/safetynet
COPY pyproject.toml README.md ./
COPY actors ./actors
COPY supervision ./supervision
RUN pip install --no-cache-dir . \
    && useradd --system --uid 10001 --no-create-home safetynet \
    && mkdir -p /etc/safetynet

COPY config/production.example.toml /etc/safetynet/config.toml

USER 10001
# /metrics, /healthz, /readyz (set http.listen = "0.0.0.0:9464" in the mounted config
# to expose them outside the container; the default binds loopback only).
EXPOSE 9464
HEALTHCHECK --interval=15s --timeout=3s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:9464/healthz', timeout=2).status == 200 else 1)"]

ENTRYPOINT ["safetynet"]
CMD ["run", "-c", "/etc/safetynet/config.toml"]
