"""Ledger-core integration tests: make the shared helpers importable as `ledger_helpers`.

The helpers live in a module of their own (not fixtures) because the hypothesis state
machine, which runs outside pytest's fixtures, uses them too.
"""

from __future__ import annotations

import sys
from pathlib import Path

_HERE = str(Path(__file__).parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
