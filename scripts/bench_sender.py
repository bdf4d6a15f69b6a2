#!/usr/bin/env python
"""The sender alone: client CPU per send, ours beside a plain aiohttp client, same receiver, same run.

No database and no queue: only what the worker does between a claim and a record. Against
`bench_delivery.py`'s receiver (its own process) it sends the same signed 512-byte body three
ways, each N times, and prints the CPU this process spent per send and the rate:
  - plain: one aiohttp session, 64 coroutines posting in a loop (the delivery ceiling's client);
  - sender, futures: `Sender.submit` in gathered batches of 100, 20 batches at once, as the
    engine does (about 2,000 sends queued on 64 connections per host);
  - sender, a task per send: the same batches, each send wrapped in its own task: the engine's
    shape before the scheduler, without the three semaphores each of those tasks also waited on
    (so the baseline is, if anything, cheaper than the old code was).

    .venv/bin/python scripts/bench_sender.py [--sends 20000] [--rounds 2] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import aiohttp

from delivery import event_loop
from delivery.engine.sender import SESSION_HEADERS, Sender, SenderSettings, SendRequest
from signing import Signer, generate_secret

CONNECTIONS = 64
BATCH = 100
BATCHES_AT_ONCE = 20
ENDPOINTS = 24
BODY = b"x" * 512
BENCH_DELIVERY = Path(__file__).with_name("bench_delivery.py")


async def plain(base: str, sends: int) -> None:
    pending = iter(range(sends))
    connector = aiohttp.TCPConnector(limit=CONNECTIONS, limit_per_host=CONNECTIONS)
    signature = Signer([generate_secret()]).sign("msg_0", int(time.time()), BODY)
    async with aiohttp.ClientSession(connector=connector, headers=SESSION_HEADERS) as session:
        async def client() -> None:
            for number in pending:
                headers = {"webhook-id": str(uuid.UUID(int=number)), "webhook-timestamp": str(int(time.time())),
                           "webhook-signature": signature}
                async with session.post(f"{base}/hook/{number % ENDPOINTS}", data=BODY, headers=headers) as response:
                    await response.read()

        await asyncio.gather(*(client() for _ in range(CONNECTIONS)))


async def through_sender(base: str, sends: int, task_per_send: bool) -> None:
    signer = Signer([generate_secret()])
    settings = SenderSettings(allow_loopback=True, connections_per_host_max=CONNECTIONS)
    numbers = iter(range(sends))
    async with Sender(settings) as sender:
        def request(number: int) -> SendRequest:
            delivery_id = str(uuid.UUID(int=number))
            headers = signer.headers(delivery_id, int(time.time()), BODY)
            endpoint = str(number % ENDPOINTS)
            return SendRequest(delivery_id, 1, f"{base}/hook/{endpoint}", BODY, headers, 15_000, endpoint)

        async def lane() -> None:
            while batch := [number for _, number in zip(range(BATCH), numbers)]:
                if task_per_send:
                    results = await asyncio.gather(*(sender.send(request(number)) for number in batch))
                else:
                    results = await asyncio.gather(*[sender.submit(request(number)) for number in batch])
                assert all(result.success for result in results), results[0]

        await asyncio.gather(*(lane() for _ in range(BATCHES_AT_ONCE)))


async def main(arguments: argparse.Namespace) -> None:
    receiver = subprocess.Popen([sys.executable, str(BENCH_DELIVERY), "--serve-receiver", "0"], stdout=subprocess.PIPE,
                                env={**os.environ, "BENCH_SECRET": generate_secret()})
    try:
        base = f"http://127.0.0.1:{int(receiver.stdout.readline())}"
        ways = (("plain aiohttp client (c=64)", lambda: plain(base, arguments.sends)),
                ("sender, futures (ours)", lambda: through_sender(base, arguments.sends, False)),
                ("sender, a task per send", lambda: through_sender(base, arguments.sends, True)))
        cpu: dict[str, list[float]] = {name: [] for name, _ in ways}
        print(f"{arguments.sends} sends per way, {arguments.rounds} rounds, interleaved; CPU of this process per send")
        for _ in range(arguments.rounds):
            for name, run in ways:
                started_cpu, started = time.process_time(), time.perf_counter()
                await run()
                spent, elapsed = time.process_time() - started_cpu, time.perf_counter() - started
                cpu[name].append(spent / arguments.sends * 1e6)
                print(f"  {name:28} {cpu[name][-1]:6.1f} µs/send  {arguments.sends / elapsed:7.0f} sends/s")
        plain_cpu = min(cpu[ways[0][0]])
        for name, values in cpu.items():
            print(f"{name:30} best {min(values):6.1f} µs/send  {min(values) / plain_cpu:5.2f}x the plain client")
        if arguments.json:
            rows = [{"way": name, "cpu_us_per_send": values, "best": min(values), "times_plain": min(values) / plain_cpu}
                    for name, values in cpu.items()]
            arguments.json.write_text(json.dumps({"benchmark": "sender", "sends": arguments.sends, "rows": rows}, indent=2) + "\n")
    finally:
        receiver.terminate()
        receiver.wait(timeout=10)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sends", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--event-loop", choices=event_loop.CHOICES, default="auto")
    parser.add_argument("--json", type=Path, help="also write the results to this JSON file")
    parsed = parser.parse_args()
    event_loop.run(main(parsed), parsed.event_loop)
