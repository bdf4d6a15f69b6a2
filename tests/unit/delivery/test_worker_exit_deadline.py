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
    time.sleep(3)  # a shutdown stuck somewhere
    print("ran to the end", flush=True)
""")


def _run(deadline: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", PROGRAM.format(deadline=deadline)], cwd=ROOT, env={"PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=60)


def test_a_stuck_shutdown_dumps_the_stacks_and_exits():
    completed = _run("0.5")
    assert completed.returncode == 1, completed
    assert "ran to the end" not in completed.stdout
    assert "exits by force if it has not within 0.5 s" in completed.stderr
    assert "Timeout (0:00:00.500000)!" in completed.stderr
    assert "(most recent call first)" in completed.stderr and 'File "<string>", line 8 in <module>' in completed.stderr  # the sleep


def test_an_embedded_worker_is_never_forced_out():
    completed = _run("None")
    assert completed.returncode == 0, completed
    assert "ran to the end" in completed.stdout
    assert "by force" not in completed.stderr and "Timeout" not in completed.stderr


def test_a_second_signal_does_not_push_the_deadline_back():
    """Armed at the first signal: a second one 0.8 s later (Ctrl-C after a SIGTERM) leaves it at 1 s,
    so the process is gone before the 1.5 s mark; re-armed, it would have lived to 1.8 s."""
    program = textwrap.dedent("""
        import signal, time
        from delivery.platform import config, worker
        stuck = worker.build_worker(config.load({}), "redis://127.0.0.1:9/0", handle_signals=False, redis_pool=object())
        stuck.exit_deadline_seconds = 1.0
        stuck.handle_sig(signal.SIGTERM)
        time.sleep(0.8)
        stuck.handle_sig(signal.SIGINT)
        print("second signal", flush=True)
        time.sleep(0.7)
        print("1.5 s", flush=True)
        time.sleep(3)
    """)
    completed = subprocess.run([sys.executable, "-c", program], cwd=ROOT, env={"PATH": "/usr/bin:/bin"},
                               capture_output=True, text=True, timeout=60)
    assert completed.returncode == 1, completed
    assert "second signal" in completed.stdout and "1.5 s" not in completed.stdout, completed
    assert completed.stderr.count("Timeout (0:00:01)!") == 1, completed.stderr
