"""Secret files no tool shows the model: ``.git/`` internals, ``.env``, keys, per deployment.

A pattern names entries by their name (``fnmatch``, in any letter case: ``SERVER.PEM`` is as
secret as ``server.pem``, and on a case-insensitive file system the same file): ``*.pem``
hides every ``.pem`` file at any depth. A pattern ending in ``/`` names directories only, and
hides everything under them (``.git/``). A pattern holding another ``/`` is matched against
the path relative to the workspace (``config/prod.yaml``). The default is
``DEFAULT_DENYLIST`` (``shared/secret_files.py``); a deployment's own list replaces it, but
``.git/`` stays hidden whatever the list says (``'[]'`` leaves only that).

The read tools skip denied entries while walking and refuse them by name; the write tools
refuse them too (an ``edit_file`` that reports "matched 0 times" is an oracle on the
content); ``run_python`` never copies them into its view of the workspace.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from pathlib import PurePosixPath

from signalbox.shared.secret_files import ALWAYS_DENIED, DEFAULT_SECRET_DENYLIST

DEFAULT_DENYLIST = DEFAULT_SECRET_DENYLIST


def denied(relative: PurePosixPath, is_dir: bool, patterns: Sequence[str]) -> str | None:
    """The pattern that hides ``relative`` (or one of its parent directories), or None.

    ``ALWAYS_DENIED`` is checked whatever ``patterns`` holds."""
    patterns = [*patterns, *(p for p in ALWAYS_DENIED if p not in patterns)]
    parts = relative.parts
    for index, name in enumerate(parts):
        last = index == len(parts) - 1
        here = "/".join(parts[: index + 1])
        for pattern in patterns:
            dir_only = pattern.endswith("/")
            body = pattern.rstrip("/")
            if dir_only and last and not is_dir:
                continue
            target = here if "/" in body else name
            if fnmatch.fnmatchcase(target.casefold(), body.casefold()):
                return pattern
    return None
