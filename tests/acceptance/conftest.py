"""Acceptance tests reuse the engine fixtures (receivers, keyring)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration" / "engine"))

from engine_helpers import keyring, receiver_factory  # noqa: E402, F401
