"""parent_death: a child started with its preexec_fn ends when its parent is killed."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from delivery.platform import parent_death

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (killed, not yet reaped by init) counts as gone.
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.parametrize("tied", [True, False])
def test_a_tied_child_ends_with_its_killed_parent(tied: bool) -> None:
    """The parent starts `sleep 60` (tied or not) and SIGKILLs itself: the tied child is gone within
    seconds; the untied one is still there (so the check can fail), and the test ends it."""
    code = (
        "import os, signal, subprocess, sys\n"
        "from delivery.platform import parent_death\n"
        f"preexec = parent_death.preexec() if {tied} else None\n"
        "child = subprocess.Popen(['sleep', '60'], preexec_fn=preexec, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
        "print(child.pid, flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    parent = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert parent.returncode == -9, parent.stderr
    child = int(parent.stdout.split()[0])
    try:
        deadline = time.monotonic() + (10 if tied else 2)  # the untied child only has to outlast a tied one
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _alive(child) != tied
    finally:
        if _alive(child):
            os.kill(child, 9)


def test_only_the_main_thread_ties_children() -> None:
    """The kernel signals when the parent *thread* ends: a child started from a passing thread would be
    stopped with it, so off the main thread there is no tie."""
    assert callable(parent_death.preexec())
    found = []
    thread = threading.Thread(target=lambda: found.append(parent_death.preexec()))
    thread.start()
    thread.join()
    assert found == [None]
