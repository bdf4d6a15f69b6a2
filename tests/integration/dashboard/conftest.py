"""Dashboard HTTP tests: fixtures in dashboard_helpers.py (also used by tests/browser)."""

from __future__ import annotations

import sys
from pathlib import Path

if str(Path(__file__).parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).parent))

from dashboard_helpers import dash, dashboard_server  # noqa: E402,F401
