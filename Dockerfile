# The Engram service image. It expects ENGRAM_DATABASE_URL (see docker-compose.yml); without it
# the service starts its embedded PostgreSQL inside the container's data volume
# (/var/lib/engram, declared below so that it outlives the container), in development only
# (production refuses the embedded database on 0.0.0.0), and needs `--shm-size=2g` for index
# builds (ENGRAM_AGENT_INDEX_BUILD_MEMORY; Docker's /dev/shm is 64 MB).
# Not built on the development machines (they have only a docker client); kept correct by review.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    ENGRAM_HOST=0.0.0.0 \
    ENGRAM_PORT=8000 \
    ENGRAM_DATA_DIR=/var/lib/engram

# The service runs as a user of its own (uid and gid 10001, which a compose secret's uid and gid
# name), which owns only its data volume.
RUN groupadd --system --gid 10001 engram \
    && useradd --system --uid 10001 --gid engram --home-dir /var/lib/engram engram \
    && mkdir -p /var/lib/engram && chown engram:engram /var/lib/engram
WORKDIR /srv/engram
# The dependencies pyproject.toml lists, and its build backend, in a layer that only a change to
# pyproject.toml builds again: a change to the code reinstalls the package alone, below.
COPY pyproject.toml ./
RUN python -c 'import tomllib; project = tomllib.load(open("pyproject.toml", "rb")); \
print("\n".join(project["build-system"]["requires"] + project["project"]["dependencies"]))' \
    > requirements.txt \
    && pip install -r requirements.txt && rm requirements.txt
COPY README.md ./
COPY app ./app
COPY migrations ./migrations
# Editable install keeps migrations/ beside the app package, where alembic finds it; `pip check`
# fails the build should the layer above lack a dependency the package names.
RUN pip install --no-deps --no-build-isolation -e . && pip check
VOLUME ["/var/lib/engram"]
USER engram

EXPOSE 8000
# The port the service listens on (ENGRAM_PORT); a first start may migrate a large database
# for minutes, so failures count only after the start period.
HEALTHCHECK --interval=10s --timeout=3s --start-period=300s --retries=5 \
  CMD python -c "import os,urllib.request,sys; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('ENGRAM_PORT', '8000')).status == 200 else 1)"
# On SIGTERM (`docker stop`) the service finishes the requests running, a turn within
# ENGRAM_TURN_TIMEOUT_SECONDS (600) and its commit: give it `docker stop --time 660` or
# `docker run --stop-timeout 660` (compose: stop_grace_period), not Docker's default 10 s, past
# which a running turn is killed and left to the sweep (docs/operations.md, "Starting, and
# what stops a start").
# PID 1 with no init: engram serve reaps its embedded PostgreSQL's processes itself
# (docs/operations.md, "Health and logs"); `docker run --init` reaps anything else.
CMD ["engram", "serve"]
