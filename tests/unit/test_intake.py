"""delivery.engine.intake: how many deliver jobs a worker takes, from its sender's connections and
what it has taken on and not yet sent."""

from __future__ import annotations

from dataclasses import dataclass

from delivery.engine.intake import Intake
from delivery.engine.queue import IDS_PER_JOB_MAX


@dataclass
class Sends:
    connections_max: int = 256
    running: int = 0
    waiting: int = 0


def test_an_idle_worker_takes_twice_its_connections():
    intake = Intake(Sends())
    assert intake.room() == 512
    assert intake.jobs_allowed() == 2  # one per IDS_PER_JOB_MAX of room, rounded up
    assert Intake(Sends(connections_max=4)).jobs_allowed() == 1


def test_a_started_job_counts_whole_until_it_reads_its_ids_then_as_what_it_claims():
    sends = Sends()
    intake = Intake(sends)
    intake.job_started("a")
    intake.job_started("b")
    assert intake.room() == 512 - 2 * IDS_PER_JOB_MAX and intake.jobs_allowed() == 0
    reserved = intake.reserve(40)  # job a read 40 ids
    intake.job_reading("a")
    assert intake.room() == 512 - IDS_PER_JOB_MAX - 40
    intake.release(reserved, 10)  # 10 of them were no longer due
    assert intake.taken_on == 30
    sends.running += 30  # handed to the sender, all on the wire
    intake.release(reserved)
    assert intake.taken_on == 0 and reserved == [0]
    intake.release(reserved)  # nothing left: no change
    assert intake.room() == 512 - IDS_PER_JOB_MAX - 30


def test_sends_waiting_count_only_while_every_connection_is_busy():
    """Below the bound in all, a waiting send waits behind its endpoint's or host's bound: a worker
    with one slow endpoint still takes other work. At the bound, they are work it holds."""
    sends = Sends(running=64, waiting=3000)  # one host at its bound of 64, 3,000 behind it
    intake = Intake(sends)
    assert intake.room() == 512 - 64 and intake.jobs_allowed() == 1
    sends.running, sends.waiting = 256, 255
    assert intake.room() == 1 and intake.jobs_allowed() == 1
    sends.waiting = 256
    assert intake.room() == 0 and intake.jobs_allowed() == 0


def test_jobs_that_ended_before_reading_their_ids_are_forgotten_and_the_room_announced():
    heard: list[int] = []
    intake = Intake(Sends())
    intake.on_room = lambda: heard.append(intake.room())
    intake.job_started("a")
    intake.job_started("b")
    intake.forget_jobs(["b"])  # a's task is done: it failed before it read its ids
    assert intake.jobs_starting == {"b"} and heard == [512 - IDS_PER_JOB_MAX]
    intake.forget_jobs(["b"])
    assert len(heard) == 1  # nothing changed: nothing announced
    intake.job_reading(None)  # a job the intake never counted
    intake.job_reading("b")
    assert intake.jobs_starting == set() and heard[-1] == 512
