"""Browser tests: Playwright (async API) driving Debian's headless chromium against the real app.

The API with its dashboard, a real arq worker and the loopback receivers all run in the test's
event loop, so Playwright runs with its async API in that same loop. The browser is
/usr/bin/chromium (scripts/test installs it when missing); Playwright's own browser download is
never used. Without chromium (or the playwright package) these tests skip and say why.
Screenshots of every page go to test-artifacts/screenshots/ (ignored by git).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

_TESTS = Path(__file__).resolve().parents[1]
for _folder in (_TESTS / "integration" / "engine", _TESTS / "integration" / "dashboard"):
    if str(_folder) not in sys.path:
        sys.path.insert(0, str(_folder))

from browser_helpers import browser_page, platform  # noqa: E402,F401
from engine_helpers import keyring, receiver_factory  # noqa: E402,F401

CHROMIUM = "/usr/bin/chromium"


def pytest_collection_modifyitems(config, items):
    reason = None
    if not Path(CHROMIUM).exists() and shutil.which("chromium") is None:
        reason = f"{CHROMIUM} is not installed (scripts/test installs it with apt-get when run as root)"
    else:
        try:
            import playwright  # noqa: F401
        except ImportError:
            reason = "the playwright package is not installed (pip install -e '.[test]')"
    if reason is None:
        return
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.fspath).parents:
            item.add_marker(pytest.mark.skip(reason=reason))
