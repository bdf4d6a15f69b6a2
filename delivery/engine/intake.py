"""How much more delivery work a worker should take off the queue: its sender's connections not yet
busy, and as many again, less the deliveries it has taken on and not yet sent.

A worker that took every deliver job it had a slot for (twenty jobs of 500) would lease a burst of
10,000 deliveries at once and queue them behind its own connections, while a worker started or
polled a moment later found the queue empty and idled; sends held past their lease were given back
unsent and claimed again. So a deliver job is taken only while there is room here; the jobs left
in the queue go to the workers that have room.

Taken on and not yet sent: a deliver job started (counted as a whole job until it reads its ids),
a claim in flight, claimed deliveries being checked before they are sent, and, while every
connection is busy, the sends waiting in the sender. While a connection is free no send waits for
the bound in all (send_lanes never leaves a slot free that a waiting send may take), so the sends
that wait then wait behind one endpoint's or one host's bound: they do not count, or a worker with
one slow endpoint would take no other work. The second set (as many as the connections) is
claimed while the connections are busy, so they do not idle while the next claim is made.

`room_changed` is called as sends end and reservations are handed over; while the worker holds
deliver jobs back it checks the room then, and reads the queue again once there is some.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol

from delivery.engine.queue import IDS_PER_JOB_MAX


class Sends(Protocol):
    """What the intake reads of the sender."""

    connections_max: int
    running: int  # sends on the wire, or allowed to start and about to be
    waiting: int  # sends queued behind a bound


class Intake:
    def __init__(self, sender: Sends) -> None:
        self._sender = sender
        self.taken_on = 0  # deliveries reserved by claims not yet handed to the sender
        self.jobs_starting: set[str] = set()  # deliver jobs started that have not yet reserved their ids
        self.on_room: Callable[[], None] | None = None

    def room(self) -> int:
        """Deliveries this worker can start sending at once beyond what it holds (may be negative)."""
        sender = self._sender
        running, connections = sender.running, sender.connections_max
        unsent = self.taken_on + IDS_PER_JOB_MAX * len(self.jobs_starting) + (sender.waiting if running >= connections else 0)
        return 2 * connections - running - unsent

    def jobs_allowed(self) -> int:
        """How many more deliver jobs to take now: one per IDS_PER_JOB_MAX of room, rounded up."""
        room = self.room()
        return 0 if room <= 0 else -(-room // IDS_PER_JOB_MAX)

    def job_started(self, job_id: str) -> None:
        self.jobs_starting.add(job_id)

    def job_reading(self, job_id: str | None) -> None:
        """The job has read its ids and reserves them now (or it ended without): no longer a whole job."""
        if job_id in self.jobs_starting:
            self.jobs_starting.discard(job_id)
            self.room_changed()

    def forget_jobs(self, running: Iterable[str]) -> None:
        """Drop the starting jobs that are no longer running (one that failed before it read its ids)."""
        ended = self.jobs_starting.difference(running)
        if ended:
            self.jobs_starting -= ended
            self.room_changed()

    def reserve(self, count: int) -> list[int]:
        """Count `count` deliveries as taken on; release them with `release` as they are handed over."""
        self.taken_on += count
        return [count]

    def release(self, reserved: list[int], count: int | None = None) -> None:
        """Hand over `count` (default: all that is left) of a reservation."""
        count = reserved[0] if count is None else min(count, reserved[0])
        if count > 0:
            reserved[0] -= count
            self.taken_on -= count
            self.room_changed()

    def room_changed(self) -> None:
        if self.on_room is not None:
            self.on_room()
