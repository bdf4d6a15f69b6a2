"""scripts/_venv.sh on a fresh machine: an interpreter too old, or one that cannot make a venv.

The interpreters here are stand-ins (small shell scripts answering like python would), so the
tests need no second Python; what runs is the real scripts/_venv.sh, copied beside an empty
pyproject.toml so that nothing is installed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Answers the version check (python -c '... sys.exit(sys.version_info < (3, 11))') with a 3.10's
# exit status, and --version like a 3.10.
TOO_OLD = """#!/bin/sh
if [ "$1" = "--version" ]; then echo "Python 3.10.12"; exit 0; fi
exit 1
"""
# Passes the version check, then half-makes the venv and fails, like Debian without python3-venv.
NO_VENV_MODULE = """#!/bin/sh
if [ "$1" = "-m" ] && [ "$2" = "venv" ]; then
    mkdir -p "$3/bin" && : > "$3/bin/half-made"
    echo "The virtual environment was not created successfully because ensurepip is not available." >&2
    exit 1
fi
exit 0
"""


def _project(tmp_path: Path) -> Path:
    project = tmp_path / "project"
    (project / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "_venv.sh", project / "scripts" / "_venv.sh")
    (project / "pyproject.toml").write_text("")
    (project / "scripts" / "probe").write_text('#!/usr/bin/env bash\nsource "$(dirname "$0")/_venv.sh"\necho sourced\n')
    return project


def _interpreter(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / "bin" / name
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


def _source(project: Path, python: Path) -> subprocess.CompletedProcess:
    environment = {**os.environ, "PYTHON": str(python)}
    environment.pop("HOOKLEDGER_VENV", None)
    return subprocess.run(["bash", str(project / "scripts" / "probe")], env=environment,
                          capture_output=True, text=True, timeout=60)


def test_an_interpreter_older_than_3_11_is_refused_with_what_to_do(tmp_path: Path) -> None:
    project = _project(tmp_path)
    completed = _source(project, _interpreter(tmp_path, "python3", TOO_OLD))
    assert completed.returncode == 1
    assert "sourced" not in completed.stdout
    assert "needs Python 3.11 or newer" in completed.stderr and "Python 3.10.12" in completed.stderr
    assert "PYTHON=" in completed.stderr
    assert not (project / ".venv").exists()


def test_a_venv_that_cannot_be_made_is_removed_and_explained(tmp_path: Path) -> None:
    project = _project(tmp_path)
    completed = _source(project, _interpreter(tmp_path, "python3", NO_VENV_MODULE))
    assert completed.returncode == 1
    assert "sourced" not in completed.stdout
    assert "python3-venv" in completed.stderr
    assert not (project / ".venv").exists()  # no half-made environment left for the next run to trip on


# A 3.12 whose venv holds a python that accepts everything (so the pip steps pass) and notes who made it.
NEWER = """#!/bin/sh
if [ "$1" = "-m" ] && [ "$2" = "venv" ]; then
    mkdir -p "$3/bin" && printf '#!/bin/sh\\nexit 0\\n' > "$3/bin/python" && chmod +x "$3/bin/python"
    echo "made by python3.12" > "$3/made-by"
fi
exit 0
"""


def test_without_python_set_a_newer_interpreter_beside_an_old_python3_is_chosen(tmp_path: Path) -> None:
    project = _project(tmp_path)
    _interpreter(tmp_path, "python3", TOO_OLD)
    _interpreter(tmp_path, "python3.13", TOO_OLD)  # shadows a real one in /usr/bin, which the loop would try first
    _interpreter(tmp_path, "python3.12", NEWER)
    environment = {**os.environ, "PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin"}
    for name in ("PYTHON", "HOOKLEDGER_VENV"):
        environment.pop(name, None)
    completed = subprocess.run(["bash", str(project / "scripts" / "probe")], env=environment,
                               capture_output=True, text=True, timeout=60)
    assert completed.returncode == 0, completed.stderr
    assert "sourced" in completed.stdout
    assert (project / ".venv" / "made-by").read_text().strip() == "made by python3.12"
