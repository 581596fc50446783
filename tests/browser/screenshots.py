"""Regenerate docs/screenshots/ (desktop and phone width): ``python -m tests.browser.screenshots``.

The browser tests take the screenshots at the states they check when
``SIGNALBOX_SCREENSHOTS=1``; this runs them so. Extra arguments go to pytest.
"""

from __future__ import annotations

import os
import sys

import pytest


def main(argv: list[str]) -> int:
    """Run the browser tests with screenshots on; the exit status is pytest's."""
    os.environ["SIGNALBOX_SCREENSHOTS"] = "1"
    here = os.path.dirname(os.path.abspath(__file__))
    return int(pytest.main([here, "-q", "-p", "no:cacheprovider", *argv]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
