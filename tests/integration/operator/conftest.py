"""Operator-tool tests: reuse the engine's fixtures (real worker, loopback receivers) and our helpers."""

from __future__ import annotations

import sys
from pathlib import Path

_HERE = Path(__file__).parent
for _folder in (_HERE, _HERE.parent / "engine", _HERE.parent / "billing", _HERE.parent / "api"):
    if str(_folder) not in sys.path:
        sys.path.insert(0, str(_folder))

from engine_helpers import arq_queue, keyring, receiver_factory, settings  # noqa: E402,F401
