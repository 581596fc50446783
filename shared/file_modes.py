"""State on disk is private to the user the services run as: directories 0700, files 0600.

The SQLite database holds every user's messages and the token files log anyone in, so no
other local account (nor code that gets out of a sandbox as another uid) may read them.
New files get it from the umask each entry point sets; files an older version left
readable are narrowed by ``make_private``.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

PRIVATE_UMASK = 0o077  # group and others get nothing: mkdir 0700, open/create 0600
PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600


def keep_new_files_private() -> None:
    """Set this process's umask to 077; the children it starts inherit it."""
    os.umask(PRIVATE_UMASK)


def make_private(path: Path) -> None:
    """Narrow an existing directory to 0700 or regular file to 0600; leave anything else.

    A symlink is not followed: its target is not ours to change.
    """
    try:
        st = path.lstat()
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        mode = PRIVATE_DIR_MODE
    elif stat.S_ISREG(st.st_mode):
        mode = PRIVATE_FILE_MODE
    else:
        return
    if stat.S_IMODE(st.st_mode) & ~mode:
        os.chmod(path, stat.S_IMODE(st.st_mode) & mode)


def private_dir(path: Path) -> Path:
    """``path`` as a directory (parents too) that only this user can enter."""
    path.mkdir(mode=PRIVATE_DIR_MODE, parents=True, exist_ok=True)
    make_private(path)
    return path
