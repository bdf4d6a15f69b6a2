"""The import layering of DESIGN.md holds: signing imports nothing of ours, billing never imports delivery."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_import_linter_contracts_are_kept() -> None:
    """import-linter checks the contracts in pyproject.toml; a broken one fails this test."""
    executable = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or "lint-imports"
    completed = subprocess.run([executable], cwd=ROOT, capture_output=True, text=True)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert "BROKEN" not in completed.stdout
    assert "6 kept" in completed.stdout
