# One image for every Signalbox service; docker-compose.yml picks the command.
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# bubblewrap: run_python's sandbox (the tools-sandbox service); setpriv (util-linux) and
# mount come with the base image.
RUN apt-get update \
    && apt-get install -y --no-install-recommends bubblewrap \
    && rm -rf /var/lib/apt/lists/*

RUN useradd --create-home --uid 10001 signalbox \
    # The workspaces volume takes this directory's owner and mode (0700: nobody else's)
    # when Docker first creates it.
    && mkdir -p /data/workspaces \
    && chown signalbox:signalbox /data/workspaces \
    && chmod 0700 /data/workspaces

WORKDIR /app
COPY pyproject.toml README.md ./
COPY shared ./shared
COPY services ./services
COPY signalbox ./signalbox
RUN pip install . && rm -rf build *.egg-info

USER signalbox
EXPOSE 8000 8001
CMD ["signalbox", "--help"]
