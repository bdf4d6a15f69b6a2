"""No test imports a conftest module by name.

pytest puts each test directory on sys.path and imports every conftest.py as the module
`conftest`, so the first one imported wins: `from conftest import X` in one directory gets another
directory's conftest when both run in one pytest call (tests/unit/sdk and tests/integration/sdk
did). Share through a fixture or a uniquely named helper module instead.
"""

from __future__ import annotations

import re
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
_IMPORT = re.compile(r"^\s*(from\s+conftest\s+import|import\s+conftest\b)", re.MULTILINE)


def test_no_test_module_imports_conftest():
    offenders = [str(path.relative_to(TESTS)) for path in sorted(TESTS.rglob("*.py"))
                 if _IMPORT.search(path.read_text(encoding="utf-8"))]
    assert offenders == []
