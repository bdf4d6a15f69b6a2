"""The embedded Redis answers on its own (the whole platform on embedded servers: test_run_demo.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_embedded_redis_answers_and_is_gone_after_exit() -> None:
    """The embedded Redis (a redis-server of the process's own) starts and answers PING over its unix
    socket; when the process exits, the server stops and its directory is removed."""
    code = (
        "import asyncio, redis.asyncio as r\n"
        "from delivery.platform import services\n"
        "url = services.start_embedded_redis()\n"
        "print(url)\n"
        "async def main():\n"
        "    client = r.Redis.from_url(url)\n"
        "    print(await client.ping())\n"
        "    await client.aclose()\n"
        "asyncio.run(main())\n"
    )
    completed = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert completed.returncode == 0, completed.stderr
    url, answer = completed.stdout.split()
    assert answer == "True"
    assert url.startswith("unix://") and not Path(url.removeprefix("unix://")).parent.exists(), url
