"""No name is used that is not defined: pyflakes over the project's code, its undefined-name
messages only (the conftests' fixture re-exports are unused imports by design).

A name used only on a rare path (an `except` clause, a refusal) fails only when that path runs:
the dashboard's endpoint form once caught an exception class it never imported, a NameError
and a 500 that only a test reaching that branch could show.
"""

from __future__ import annotations

import ast
from pathlib import Path

from pyflakes import checker, messages

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("billing", "delivery", "signing", "migrations", "scripts", "tests")
UNDEFINED = (messages.UndefinedName, messages.UndefinedLocal, messages.UndefinedExport)


def _sources() -> list[Path]:
    return sorted(path for package in PACKAGES for path in (ROOT / package).rglob("*.py"))


def test_the_check_sees_an_undefined_name():
    tree = ast.parse("try:\n    pass\nexcept NotImported:\n    pass\n")
    assert any(isinstance(m, UNDEFINED) for m in checker.Checker(tree, filename="example.py").messages)


def test_no_undefined_names():
    found = []
    for path in _sources():
        tree = ast.parse(path.read_text(), filename=str(path))
        found += [str(m) for m in checker.Checker(tree, filename=str(path)).messages if isinstance(m, UNDEFINED)]
    assert len(_sources()) > 100  # the packages were found
    assert not found, "\n".join(found)
