"""delivery.engine.queue writes jobs arq reads: the ids, the function, and the time each job is due."""

from __future__ import annotations

import uuid
from datetime import timedelta

from arq.jobs import Job

from delivery.engine import queue as job_queue


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
    ids = [uuid.uuid4() for _ in range(3)]
    before_ms = (await arq_queue.redis.time())[0] * 1000
    await arq_queue.wake(ids)
    ((info, score, _),) = await _jobs(arq_queue)
    # JSON, not pickle: the args come back as lists.
    assert info.function == "deliver" and list(info.args) == [[str(i) for i in ids]] and info.kwargs == {}
    assert before_ms - 5000 <= score <= before_ms + 5000
    assert info.score == score  # what arq's worker compares with its clock


async def test_many_ids_are_split_into_jobs_of_at_most_the_limit(arq_queue) -> None:
    ids = [uuid.uuid4() for _ in range(2 * job_queue.IDS_PER_JOB_MAX + 1)]
    await arq_queue.wake(ids)
    jobs = await _jobs(arq_queue)
    assert sorted(len(info.args[0]) for info, _, _ in jobs) == [1, job_queue.IDS_PER_JOB_MAX, job_queue.IDS_PER_JOB_MAX]
    assert sorted(i for info, _, _ in jobs for i in info.args[0]) == sorted(str(i) for i in ids)


async def test_a_deferred_job_is_due_after_its_delay_and_outlives_it(arq_queue) -> None:
    await arq_queue.wake([uuid.uuid4()])
    await arq_queue.defer_by([uuid.uuid4()], timedelta(minutes=5))
    (_, now_score, _), (_, later_score, later_id) = sorted(await _jobs(arq_queue), key=lambda job: job[1])
    assert 299_000 <= later_score - now_score <= 301_000
    assert await arq_queue.redis.pttl(f"arq:job:{later_id}") > 300_000  # the job lives past the time it is due


async def test_no_ids_writes_nothing(arq_queue) -> None:
    await arq_queue.wake([])
    assert await arq_queue.redis.zcard(job_queue.QUEUE_NAME) == 0
