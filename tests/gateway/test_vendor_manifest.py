"""The vendored browser libraries are exactly the files their manifest names."""

from __future__ import annotations

import hashlib
import json
import re

from signalbox.services.gateway.routes.ui import STATIC_DIR

VENDOR = STATIC_DIR / "vendor"


def test_every_vendored_file_is_listed_and_matches_its_sha256() -> None:
    manifest = json.loads((VENDOR / "MANIFEST.json").read_text())
    listed = {entry["file"]: entry for entry in manifest["files"]}
    on_disk = {p.name for p in VENDOR.iterdir() if p.name != "MANIFEST.json"}
    assert on_disk == set(listed), "vendor/ and MANIFEST.json disagree"
    for name, entry in listed.items():
        digest = hashlib.sha256((VENDOR / name).read_bytes()).hexdigest()
        assert digest == entry["sha256"], f"{name} is not {entry['package']}@{entry['version']}"
        assert entry["package"] and entry["version"] and entry["path_in_package"]


def test_the_page_loads_only_vendored_or_own_scripts() -> None:
    """No CDN: every script and stylesheet the UI names is served by the gateway."""
    html = (STATIC_DIR / "index.html").read_text()
    assert "http://" not in html and "https://" not in html
    assert "<script>" not in html  # no inline script
    assert not re.search(r"\son[a-z]+\s*=", html), "no inline event handler (onclick=...)"
