#!/usr/bin/env python3
"""A loopback OTLP/HTTP trace collector that discards what it gets: where the benchmarks export
spans when they measure the cost of tracing (`--tracing off,1%,100%`).

It answers every POST /v1/traces with an empty ExportTraceServiceResponse, reading the body and
counting requests and bytes (GET /stats), and parses nothing, so its own CPU stays small and out
of the process measured. Run as a process of its own: it prints the port it listens on.

Also: the tracing modes a benchmark takes (`modes`), and the OpenTelemetry environment of each
(`environment`): off (none), or the OTLP exporter pointed here with the parent-based ratio
sampler, as an operator would set it.

Usage (as the benchmarks run it): otlp_sink.py [PORT]   (0 or none: any free port)
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from aiohttp import web

MODE_OFF = "off"


def modes(text: str) -> list[str]:
    """--tracing: a comma-separated list of off and percentages (say off,1%,100%)."""
    values = [part.strip() for part in text.split(",") if part.strip()]
    if not values:
        raise argparse.ArgumentTypeError("a comma-separated list of off and sampling percentages, say off,1%,100%")
    for value in values:
        if value != MODE_OFF and ratio(value) is None:
            raise argparse.ArgumentTypeError(f"{value!r} is neither off nor a percentage from 0% to 100%")
    return values


def ratio(mode: str) -> float | None:
    """The sampling ratio a mode names (1% -> 0.01), or None for off (or a mode that names none)."""
    if mode == MODE_OFF or not mode.endswith("%"):
        return None
    try:
        share = float(mode[:-1]) / 100
    except ValueError:
        return None
    return share if 0 <= share <= 1 else None


def environment(mode: str, port: int) -> dict[str, str]:
    """The OTEL_* variables that turn tracing on at this mode's ratio, exporting to the sink on port."""
    share = ratio(mode)
    if share is None:
        return {}
    return {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
            "OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": repr(share)}


def without_tracing(variables: dict[str, str]) -> dict[str, str]:
    """An environment with every OTEL_* variable taken out (the benchmark's own may carry some)."""
    return {name: value for name, value in variables.items() if not name.startswith("OTEL_")}


def serve(port: int) -> None:
    counts = {"requests": 0, "bytes": 0}
    empty = b""  # an ExportTraceServiceResponse with no partial_success: zero bytes in protobuf

    async def traces(request: web.Request) -> web.Response:
        counts["requests"] += 1
        counts["bytes"] += len(await request.read())
        return web.Response(body=empty, content_type="application/x-protobuf")

    async def stats(request: web.Request) -> web.Response:
        return web.json_response(counts)

    async def main() -> None:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/traces", traces)
        app.router.add_get("/stats", stats)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", port)
        await site.start()
        print(runner.addresses[0][1], flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("port", type=int, nargs="?", default=0)
    serve(parser.parse_args().port)
    sys.exit(0)
