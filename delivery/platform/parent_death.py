"""Children that end when the process that started them dies, even by SIGKILL.

`hookledger run` starts the API, a worker, a local receiver and an embedded Redis. Stopped by a
signal it can catch, it stops them itself; killed (SIGKILL, the OOM killer, a crash), it could
not, and all of them kept running with no owner. On Linux the kernel can tell a child when its
parent dies (`prctl(PR_SET_PDEATHSIG)`): `preexec()` asks it to send the child SIGTERM then,
which each of them handles as a normal stop. Elsewhere it returns None and nothing changes.

The signal follows the parent *thread* that started the child, not the process, so a child is
only tied to a parent started from the main thread; from another thread it would be stopped
when that thread ends.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys
import threading
from collections.abc import Callable

_PR_SET_PDEATHSIG = 1


def preexec(signal_number: int = signal.SIGTERM) -> Callable[[], None] | None:
    """A `preexec_fn` for subprocess.Popen that ties the child's life to this process, or None
    where that cannot be done (not Linux, or not the main thread)."""
    if not sys.platform.startswith("linux") or threading.current_thread() is not threading.main_thread():
        return None
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    parent = os.getpid()

    def tie_to_parent() -> None:  # runs in the child, between fork and exec
        libc.prctl(_PR_SET_PDEATHSIG, signal_number, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the tie was made: act as if just told
            os.kill(os.getpid(), signal_number)

    return tie_to_parent
