# One image for every Signalbox service; docker-compose.yml and deploy/k8s pick the command.
# Reproducible: the Python packages come from requirements.lock (versions and hashes; see
# scripts/lock), the project itself is installed without resolving anything. To pin the base
# image too: docker build --build-arg PYTHON_IMAGE=python:3.11-slim@sha256:<digest> .
ARG PYTHON_IMAGE=python:3.11-slim
FROM ${PYTHON_IMAGE}

ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# bubblewrap: run_python's sandbox (the tools-sandbox service); setpriv (util-linux) and
# mount come with the base image. git: the proposals service's git features (a workspace's
# status, SIGNALBOX_GIT_COMMIT_ON_APPLY), which do nothing where git is missing.
RUN apt-get update \
    && apt-get install -y --no-install-recommends bubblewrap git \
    && rm -rf /var/lib/apt/lists/*

RUN useradd --create-home --uid 10001 signalbox \
    # The workspaces volume takes this directory's owner and mode (0700: nobody else's)
    # when Docker first creates it.
    && mkdir -p /data/workspaces \
    && chown signalbox:signalbox /data/workspaces \
    && chmod 0700 /data/workspaces

WORKDIR /app
# The dependencies first (their own layer, rebuilt only when the lock changes): every one
# pinned and hash-checked, so a build installs exactly what the lock says or fails.
COPY requirements.lock ./
RUN pip install --require-hashes -r requirements.lock
COPY pyproject.toml README.md ./
COPY shared ./shared
COPY services ./services
COPY signalbox ./signalbox
# --no-deps: nothing beyond the lock (which holds the [flower] extra too: the optional
# flower service of docker-compose.yml runs this image); pip check: the lock satisfies
# pyproject.toml.
RUN pip install --no-deps --no-build-isolation . \
    && pip check \
    && rm -rf build *.egg-info

USER signalbox
EXPOSE 8000 8001
CMD ["signalbox", "--help"]
