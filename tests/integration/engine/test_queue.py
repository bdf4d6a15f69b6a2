"""delivery.engine.queue writes jobs arq reads: the (account, delivery) ids, the function, and the
time each job is due; and it reads them back, in this format and in the previous version's."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from arq.jobs import Job

from delivery.engine import queue as job_queue
from delivery.engine.claims import DeliveryKey


def _keys(count: int) -> list[DeliveryKey]:
    return [DeliveryKey(uuid.uuid4(), uuid.uuid4()) for _ in range(count)]


async def _jobs(arq_queue):
    scores = await arq_queue.redis.zrange(job_queue.QUEUE_NAME, 0, -1, withscores=True)
    jobs = []
    for job_id, score in scores:
        job_id = job_id.decode()
        info = await Job(job_id, arq_queue.redis, _queue_name=job_queue.QUEUE_NAME,
                         _deserializer=job_queue.deserialize).info()
        jobs.append((info, score, job_id))
    return jobs


async def test_a_wake_is_a_deliver_job_due_now_with_every_id(arq_queue) -> None:
    keys = _keys(3)
    before_ms = (await arq_queue.redis.time())[0] * 1000
    await arq_queue.wake(keys)
    ((info, score, _),) = await _jobs(arq_queue)
    # JSON, not pickle: the args come back as lists, each delivery its [account_id, delivery_id].
    assert info.function == "deliver" and info.kwargs == {}
    assert list(info.args) == [[[str(key.account_id), str(key.id)] for key in keys]]
    assert job_queue.parse_deliver_job(info.args[0]) == (keys, [])
    assert before_ms - 5000 <= score <= before_ms + 5000
    assert info.score == score  # what arq's worker compares with its clock


async def test_many_ids_are_split_into_jobs_of_at_most_the_limit(arq_queue) -> None:
    keys = _keys(2 * job_queue.IDS_PER_JOB_MAX + 1)
    await arq_queue.wake(keys)
    jobs = await _jobs(arq_queue)
    assert sorted(len(info.args[0]) for info, _, _ in jobs) == [1, job_queue.IDS_PER_JOB_MAX, job_queue.IDS_PER_JOB_MAX]
    read = [key for info, _, _ in jobs for key in job_queue.parse_deliver_job(info.args[0])[0]]
    assert sorted(read) == sorted(keys)


async def test_a_deferred_job_is_due_after_its_delay_and_outlives_it(arq_queue) -> None:
    await arq_queue.wake(_keys(1))
    await arq_queue.defer_by(_keys(1), timedelta(minutes=5))
    (_, now_score, _), (_, later_score, later_id) = sorted(await _jobs(arq_queue), key=lambda job: job[1])
    assert 299_000 <= later_score - now_score <= 301_000
    assert await arq_queue.redis.pttl(f"arq:job:{later_id}") > 300_000  # the job lives past the time it is due


async def test_no_ids_writes_nothing(arq_queue) -> None:
    await arq_queue.wake([])
    assert await arq_queue.redis.zcard(job_queue.QUEUE_NAME) == 0


def test_a_job_of_the_previous_version_is_read_as_bare_ids() -> None:
    """Jobs queued by a process of the previous version carry delivery id strings alone: read as
    such (the worker claims them by id), beside the new pairs if a job ever held both."""
    keys, bare = _keys(2), [uuid.uuid4(), uuid.uuid4()]
    entries = [str(bare[0]), [str(keys[0].account_id), str(keys[0].id)], str(bare[1]),
               [str(keys[1].account_id), str(keys[1].id)]]
    assert job_queue.parse_deliver_job(entries) == (keys, bare)
    assert job_queue.parse_deliver_job([str(i) for i in bare]) == ([], bare)


@pytest.mark.parametrize("entry", [["only-one"], [str(uuid.uuid4())], 7, [str(uuid.uuid4()), "not-an-id"], None])
def test_a_malformed_entry_is_refused(entry) -> None:
    with pytest.raises(ValueError):
        job_queue.parse_deliver_job([entry])
