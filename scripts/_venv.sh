# Sourced by scripts/test and scripts/up: make sure .venv exists, built on Python 3.11+.
# Set PYTHON=python3.12 (say) to choose the interpreter that creates it.
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
        echo "Signalbox needs Python 3.11 or newer; '$PYTHON' is not (set PYTHON=python3.11)" >&2
        exit 1
    fi
    echo "==> creating .venv with $("$PYTHON" --version)"
    "$PYTHON" -m venv .venv
fi

# Packages go in with uv (a dev dependency, bootstrapped by pip on first use): it resolves and
# downloads in parallel, about 12 s for a fresh .venv where pip takes over 4 minutes. Plain pip
# is the fallback where uv cannot be installed. Output (build warnings included) is shown only
# when the install fails.
pip_install() {
    local log
    log="$(mktemp)"
    if [ ! -x .venv/bin/uv ]; then
        .venv/bin/python -m pip install --quiet --disable-pip-version-check 'uv>=0.5' \
            >"$log" 2>&1 || true
    fi
    local installer=(.venv/bin/python -m pip install --quiet --disable-pip-version-check)
    if [ -x .venv/bin/uv ]; then
        installer=(.venv/bin/uv pip install --quiet --python .venv/bin/python)
    fi
    if ! "${installer[@]}" "$@" >"$log" 2>&1; then
        cat "$log" >&2
        rm -f "$log"
        return 1
    fi
    rm -f "$log"
}

# Install Debian packages where this machine has apt-get and we may use it (root, or
# passwordless sudo); quiet, and non-zero where it could not.
apt_install() {
    command -v apt-get >/dev/null || return 1
    local sudo=""
    if [ "$(id -u)" != 0 ]; then
        { command -v sudo >/dev/null && sudo -n true 2>/dev/null; } || return 1
        sudo="sudo -n"
    fi
    { $sudo apt-get update -qq && $sudo apt-get install -y -qq "$@"; } >/dev/null 2>&1
}

# apt_install_each PKG...: all of them in one apt-get run; if that fails (one package missing
# from this release, say), each on its own, so the others still go in.
apt_install_each() {
    apt_install "$@" && return 0
    local pkg rc=0
    for pkg in "$@"; do
        apt_install "$pkg" || rc=1
    done
    return "$rc"
}

# Every Python process the services and the tests start imports celery, SQLAlchemy, FastAPI
# and the rest. Where PYTHONDONTWRITEBYTECODE is set (it was, on 2026-11-28, in this machine
# kind's environment) Python never caches what it compiles, and neither uv nor this script
# compiled at install: each process compiled every module it imported from source, twice
# the CPU of an import from bytecode (the gateway's: 5.1 s against 2.5 s under load). So:
# compile once (compileall skips what is already up to date), and let processes started
# from here cache what they import (the repository's own modules).
compile_bytecode() {
    unset PYTHONDONTWRITEBYTECODE
    .venv/bin/python -m compileall -q -j0 .venv/lib/python3*/site-packages signalbox services \
        shared tests bench >/dev/null 2>&1 || echo "    (some files did not compile: those compile at import)"
}
