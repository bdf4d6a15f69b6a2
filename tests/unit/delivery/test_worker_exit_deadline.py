"""A worker process told to stop exits by force, with every thread's stack in its log, when its
shutdown runs SHUTDOWN_OVERRUN_SECONDS past the grace; a worker embedded in another program never
does. CI once found a worker of a killed `hookledger run` still up 30 s after its SIGTERM, with
nothing in its log to say where it was."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

PROGRAM = textwrap.dedent("""
    import logging, signal, sys, time
    from delivery.platform import config, worker
    logging.basicConfig(level=logging.INFO)
    stuck = worker.build_worker(config.load({{}}), "redis://127.0.0.1:9/0", handle_signals=False, redis_pool=object())
    stuck.exit_deadline_seconds = {deadline}
    stuck.handle_sig(signal.SIGTERM)
    time.sleep({stuck_seconds})  # a shutdown stuck somewhere
    print("ran to the end", flush=True)
""")


def _run(deadline: str, stuck_seconds: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", PROGRAM.format(deadline=deadline, stuck_seconds=stuck_seconds)],
                          cwd=ROOT, env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=60)


def test_a_stuck_shutdown_dumps_the_stacks_and_exits():
    completed = _run("0.5", stuck_seconds=30)  # far past the deadline: its end is not a race on a loaded machine
    assert completed.returncode == 1, completed
    assert "ran to the end" not in completed.stdout
    assert "exits by force if it has not within 0.5 s" in completed.stderr
    assert "Timeout (0:00:00.500000)!" in completed.stderr
    assert "(most recent call first)" in completed.stderr and 'File "<string>", line 8 in <module>' in completed.stderr  # the sleep


def test_an_embedded_worker_is_never_forced_out():
    completed = _run("None", stuck_seconds=3)
    assert completed.returncode == 0, completed
    assert "ran to the end" in completed.stdout
    assert "by force" not in completed.stderr and "Timeout" not in completed.stderr


def test_a_second_signal_does_not_push_the_deadline_back():
    """Armed at the first signal: a second one 1 s later (Ctrl-C after a SIGTERM) leaves it at 2 s,
    so the process is gone before the 2.5 s mark; re-armed, it would have lived to 3 s. Each step
    has half a second or more to spare on a loaded machine: the second signal comes a whole second
    before the deadline, and the watchdog may fire up to 0.5 s late."""
    program = textwrap.dedent("""
        import signal, time
        from delivery.platform import config, worker
        stuck = worker.build_worker(config.load({}), "redis://127.0.0.1:9/0", handle_signals=False, redis_pool=object())
        stuck.exit_deadline_seconds = 2.0
        stuck.handle_sig(signal.SIGTERM)
        time.sleep(1.0)
        stuck.handle_sig(signal.SIGINT)
        print("second signal", flush=True)
        time.sleep(1.5)
        print("2.5 s", flush=True)
        time.sleep(30)
    """)
    completed = subprocess.run([sys.executable, "-c", program], cwd=ROOT, env={"PATH": "/usr/bin:/bin"},
                               capture_output=True, text=True, timeout=60)
    assert completed.returncode == 1, completed
    assert "second signal" in completed.stdout and "2.5 s" not in completed.stdout, completed
    assert completed.stderr.count("Timeout (0:00:02)!") == 1, completed.stderr
