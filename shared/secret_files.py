"""The default list of secret files no tool shows the model (``SIGNALBOX_SECRET_DENYLIST``).

Here, in ``shared/``, because both the settings (its default) and the tool workers
(``services/tools/denylist.py``, which matches it) need the one list.
"""

from __future__ import annotations

# Always hidden, whatever a deployment lists: a repository's internals hold credentials
# (a token in a remote URL) and are never what the model wants.
ALWAYS_DENIED = (".git/",)
DEFAULT_SECRET_DENYLIST = (".env", ".env.*", "*.pem", "*.key", "id_*", *ALWAYS_DENIED)
