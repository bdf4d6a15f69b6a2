"""The ingest load from wrk: C, one thread, so the server, not the load, is what runs out of core.

`bench_ingest.py`'s own load generator is an aiohttp client: in Python it spends a core on the
load, so beside the trivial handler it, not the handler, is what saturates (0.99 of a core
against the handler's 0.64), and on two cores it takes CPU from the API and PostgreSQL. wrk
spends a fraction of that, which lets the trivial handler's rate be the handler's own. It is
Debian's package `wrk` (apt-get install wrk); nothing here installs it.

Each request is a POST of the body with the next key of the list (round-robin), as the aiohttp
load sends it. wrk reports a count of non-2xx/3xx answers, not each status: those are counted
under "non-2xx".
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import tempfile

KEYS_MAX = 100_000  # keys written into the Lua script at most


class WrkUnavailable(Exception):
    """wrk is not on PATH (Debian: apt-get install wrk)."""


def available() -> bool:
    return shutil.which("wrk") is not None


def _script(keys: list[str], body: bytes, paths: list[str] | None = None) -> str:
    if not keys or len(keys) > KEYS_MAX:
        raise ValueError(f"1 to {KEYS_MAX} keys, got {len(keys)}")
    for key in keys:
        if not re.fullmatch(r"[A-Za-z0-9_\-]+", key):
            raise ValueError(f"a key wrk's script cannot quote as it is: {key[:20]!r}")
    text = body.decode()
    if "]==]" in text:
        raise ValueError("the body holds the Lua long-string terminator ]==]")
    if paths is not None and (len(paths) != len(keys) or not all(re.fullmatch(r"/[A-Za-z0-9_\-./]*", p) for p in paths)):
        raise ValueError("one plain path per key")
    paths = paths or ["/v1/messages"] * len(keys)
    return ("local keys = {" + ",".join(f'"{key}"' for key in keys) + "}\n"
            "local paths = {" + ",".join(f'"{path}"' for path in paths) + "}\n"
            "local body = [==[" + text + "]==]\n"
            "local count = 0\n"
            "request = function()\n"
            "  count = count + 1\n"
            '  return wrk.format("POST", paths[(count % #keys) + 1], {["Authorization"] = "Bearer " .. keys[(count % #keys) + 1],'
            ' ["Content-Type"] = "application/json"}, body)\n'
            "end\n")


def parse(output: str) -> tuple[int, float, int]:
    """(requests, seconds, answers that were not 2xx or 3xx) from wrk's report."""
    done = re.search(r"(\d+) requests in ([\d.]+)(m?s)", output)
    if done is None:
        raise ValueError(f"no request count in wrk's report: {output[-300:]!r}")
    seconds = float(done.group(2)) / (1000 if done.group(3) == "ms" else 1)
    failed = re.search(r"Non-2xx or 3xx responses: (\d+)", output)
    return int(done.group(1)), seconds, int(failed.group(1)) if failed else 0


async def load(base_url: str, keys: list[str], body: bytes, seconds: float, concurrency: int,
               paths: list[str] | None = None) -> tuple[float, dict]:
    """POST body round-robin over the keys for `seconds` (whole seconds, at least 1) from `concurrency`
    connections; answers that were 2xx or 3xx per second, and the counts (202 for those)."""
    if not available():
        raise WrkUnavailable(WrkUnavailable.__doc__)
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
        script.write(_script(keys, body, paths))
    try:
        process = await asyncio.create_subprocess_exec(
            "wrk", "-t1", f"-c{concurrency}", f"-d{max(1, round(seconds))}s", "-s", script.name,
            f"{base_url}/v1/messages", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        output, errors = await process.communicate()
    finally:
        os.unlink(script.name)
    if process.returncode != 0:
        raise RuntimeError(f"wrk exited with {process.returncode}: {errors.decode()[-300:]}")
    requests, elapsed, failed = parse(output.decode())
    statuses = {202: requests - failed, **({"non-2xx": failed} if failed else {})}
    return (requests - failed) / elapsed, statuses
