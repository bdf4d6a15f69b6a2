"""Dashboard HTTP tests: fixtures in dashboard_helpers.py (also used by tests/browser)."""

from __future__ import annotations

import sys
from pathlib import Path

for _folder in (Path(__file__).parent, Path(__file__).parent.parent / "api"):  # api: commit_cutter
    if str(_folder) not in sys.path:
        sys.path.insert(0, str(_folder))

from dashboard_helpers import dash, dashboard_server  # noqa: E402,F401
