"""services.remove_dead_redis_dirs: what a killed run's embedded Redis left in the temp directory
goes at the next start; nothing of a living process, nor anything not named as ours, is touched."""

from __future__ import annotations

import os
import subprocess
import sys

from delivery.platform import services


def _dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_only_the_dirs_of_dead_owners_are_removed(tmp_path) -> None:
    prefix = services.REDIS_DIR_PREFIX
    dead = tmp_path / f"{prefix}{_dead_pid()}-abc123"
    (dead / "sub").mkdir(parents=True)
    (dead / "redis.sock").write_text("")  # a killed server's socket file stays behind
    living = tmp_path / f"{prefix}{os.getpid()}-def456"
    living.mkdir()
    unnamed = tmp_path / f"{prefix}xyz-1"  # no pid: not ours to judge
    unnamed.mkdir()
    a_file = tmp_path / f"{prefix}{_dead_pid()}-file"
    a_file.write_text("keep")
    elsewhere = tmp_path / f"other-{_dead_pid()}-x"
    elsewhere.mkdir()

    assert services.remove_dead_redis_dirs(tmp_path) == [dead]
    assert not dead.exists()
    assert living.is_dir() and unnamed.is_dir() and a_file.read_text() == "keep" and elsewhere.is_dir()


def test_a_killed_owners_dir_goes_at_the_next_start(tmp_path) -> None:
    """A child starts an embedded Redis and is killed (SIGKILL: no exit handlers). Its directory,
    named with its pid, is still there; the next start_embedded_redis removes it, and the new
    server's own directory goes at that process's normal exit."""
    import signal

    child_script = ("import os, time; from delivery.platform import services; url = services.start_embedded_redis();"
                    "print(os.getpid(), url, flush=True); time.sleep(60)")
    environment = {**os.environ, "TMPDIR": str(tmp_path)}
    child = subprocess.Popen([sys.executable, "-c", child_script], stdout=subprocess.PIPE, text=True, env=environment)
    try:
        pid, url = child.stdout.readline().split()
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(10)
    left = os.path.dirname(url.removeprefix("unix://"))
    assert os.path.basename(left).startswith(f"{services.REDIS_DIR_PREFIX}{pid}-") and os.path.isdir(left)

    next_script = "from delivery.platform import services; print(services.start_embedded_redis(), flush=True)"
    done = subprocess.run([sys.executable, "-c", next_script], capture_output=True, text=True, timeout=60,
                          env=environment)
    assert done.returncode == 0, done.stderr
    assert not os.path.exists(left)
    assert list(tmp_path.iterdir()) == []  # the second process's own directory went at its exit
