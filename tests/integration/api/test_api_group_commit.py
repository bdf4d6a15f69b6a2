"""Group commit: concurrent creates across accounts coalesce into few transactions, one account's
refusal fails only its own requests, every future is resolved, and back-pressure answers 503."""

from __future__ import annotations

import asyncio
import uuid

import asyncpg
import pytest

from billing import accounts, message_direct, messages
from billing.audit import audit
from billing.errors import InsufficientBalance
from delivery import metrics
from delivery.api.group_commit import BatchFailed, Coalescer, KeyInProgress, Overloaded, ShuttingDown


async def test_many_concurrent_creates_where_one_account_lacks_balance(api):
    """300 concurrent POSTs over 3 accounts; the poor one gets 402 past its balance, the others all 202;
    balances equal the ledger and the audit is clean."""
    rich = [await api.account(balance=1000) for _ in range(2)]
    poor = await api.account(balance=10)
    for _, headers in (*rich, poor):
        await api.endpoint(headers)
    batches_before = metrics.GROUP_COMMIT_BATCH._sum.get()
    count_before = sum(bucket.get() for bucket in metrics.GROUP_COMMIT_BATCH._buckets)
    timed_before = sum(bucket.get() for bucket in metrics.GROUP_COMMIT_SECONDS._buckets)
    seconds_before = metrics.GROUP_COMMIT_SECONDS._sum.get()
    plan = [(account_id, headers) for _ in range(100) for account_id, headers in (*rich, poor)]
    responses = await asyncio.gather(*(api.send(headers) for _, headers in plan))
    by_account: dict[uuid.UUID, list[int]] = {}
    for (account_id, _), response in zip(plan, responses):
        by_account.setdefault(account_id, []).append(response.status)
    for account_id, _ in rich:
        assert by_account[account_id] == [202] * 100
    poor_statuses = by_account[poor[0]]
    assert sorted(set(poor_statuses)) == [202, 402] and poor_statuses.count(202) == 10
    for account_id, _ in (*rich, poor):
        stored = await api.pool.fetchrow(
            "SELECT a.balance, (SELECT sum(amount) FROM ledger_entries l WHERE l.account_id = a.id) AS ledger"
            " FROM accounts a WHERE a.id = $1", account_id)
        assert stored["balance"] == stored["ledger"]
    assert await api.pool.fetchval("SELECT balance FROM accounts WHERE id = $1", poor[0]) == 0
    assert (await audit(api.pool)).clean
    transactions = sum(bucket.get() for bucket in metrics.GROUP_COMMIT_BATCH._buckets) - count_before
    assert metrics.GROUP_COMMIT_BATCH._sum.get() - batches_before == 300
    assert transactions < 300  # coalesced: fewer transactions than requests
    # Every transaction is timed once, and each took some time.
    assert sum(bucket.get() for bucket in metrics.GROUP_COMMIT_SECONDS._buckets) - timed_before == transactions
    assert metrics.GROUP_COMMIT_SECONDS._sum.get() - seconds_before > 0


async def _account_with_endpoint(pool, balance: int) -> uuid.UUID:
    account = await accounts.create_account(pool, "gc", price_per_delivery=1)
    if balance:
        await accounts.top_up(pool, account.id, f"o-{account.id}", balance)
    await pool.execute(
        "INSERT INTO endpoints (id, account_id, url) VALUES ($1, $2, 'https://example.com')", uuid.uuid4(), account.id
    )
    return account.id


async def test_a_failed_transaction_fails_only_its_batch_and_resolves_every_future(pool, database_url):
    """A batch whose transaction fails (its pool is closed: a real database error path) resolves every request with
    BatchFailed; nothing is written; a coalescer on a working pool then succeeds."""
    from billing.database import create_pool

    account_id = await _account_with_endpoint(pool, 100)
    broken = await create_pool(database_url, size_min=1, size_max=1)
    await broken.close()
    coalescer = Coalescer(broken, attempts_max=3, batch_max=4, concurrency=2)
    requests = [messages.MessageRequest(account_id, "t", b"1") for _ in range(10)]
    results = await asyncio.gather(*(coalescer.submit(r) for r in requests), return_exceptions=True)
    assert all(isinstance(result, BatchFailed) for result in results), results
    assert await pool.fetchval("SELECT count(*) FROM messages") == 0
    working = Coalescer(pool, attempts_max=3)
    created = await working.submit(requests[0])
    assert isinstance(created, messages.MessageCreated)
    await working.close()


async def test_per_request_refusals_and_in_flight_keys(pool):
    """In one batch, a request the balance cannot cover is refused alone; a key already in flight is KeyInProgress."""
    rich = await _account_with_endpoint(pool, 100)
    poor = await _account_with_endpoint(pool, 0)
    coalescer = Coalescer(pool, attempts_max=3, concurrency=1)
    results = await asyncio.gather(
        coalescer.submit(messages.MessageRequest(rich, "t", b"1", "key")),
        coalescer.submit(messages.MessageRequest(rich, "t", b"1", "key")),
        coalescer.submit(messages.MessageRequest(poor, "t", b"1")),
        coalescer.submit(messages.MessageRequest(rich, "t", b"2")),
        return_exceptions=True,
    )
    assert isinstance(results[0], messages.MessageCreated)
    assert isinstance(results[1], KeyInProgress)
    assert isinstance(results[2], InsufficientBalance)
    assert isinstance(results[3], messages.MessageCreated)
    replay = await coalescer.submit(messages.MessageRequest(rich, "t", b"1", "key"))
    assert replay.replayed and replay.message_id == results[0].message_id
    await coalescer.close()


async def test_a_full_queue_answers_overloaded(pool):
    """With one transaction running and queue_max waiting, the next submit is refused at once (503 in the API)."""
    account_id = await _account_with_endpoint(pool, 100)
    coalescer = Coalescer(pool, attempts_max=3, concurrency=1, queue_max=1)
    results = await asyncio.gather(
        *(coalescer.submit(messages.MessageRequest(account_id, "t", b"1")) for _ in range(3)), return_exceptions=True
    )
    assert [type(result) for result in results][:2] == [messages.MessageCreated] * 2
    assert isinstance(results[2], Overloaded)
    await coalescer.close()


@pytest.mark.parametrize("round_number", range(5))
async def test_close_writes_every_queued_request_and_resolves_its_future(pool, round_number):
    """close() with one transaction of one request allowed and seven more queued: it returns only
    after every queued request is committed, each caller has its own result, and a submit after
    close() is refused."""
    account_id = await _account_with_endpoint(pool, 100)
    coalescer = Coalescer(pool, attempts_max=3, batch_max=1, concurrency=1)
    callers = [asyncio.create_task(coalescer.submit(messages.MessageRequest(account_id, "t", str(n).encode())))
               for n in range(8)]
    await asyncio.sleep(0)  # every caller queued
    assert coalescer.waiting == 7
    for _ in range(round_number):  # then close at different moments of the first batch
        await asyncio.sleep(0)
    await asyncio.wait_for(coalescer.close(), 20)
    assert coalescer.waiting == 0
    assert await pool.fetchval("SELECT count(*) FROM messages WHERE account_id = $1", account_id) == 8
    results = await asyncio.gather(*callers)
    assert all(isinstance(result, messages.MessageCreated) for result in results)
    assert len({result.message_id for result in results}) == 8
    with pytest.raises(ShuttingDown):
        await coalescer.submit(messages.MessageRequest(account_id, "t", b"late"))


async def test_overload_is_503_with_retry_after(api, pool, queue):
    """Through HTTP, back-pressure is a 503 problem with Retry-After, and nothing is written for it."""
    import dataclasses

    from aiohttp.test_utils import TestClient, TestServer

    from delivery.platform.web_app import create_app

    tight = dataclasses.replace(api.settings.api, group_commit_concurrency=1, group_commit_queue_max=1)
    app = create_app(dataclasses.replace(api.settings, api=tight), pool, queue)
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        _, headers = await api.account(balance=1000)
        await api.endpoint(headers)
        responses = await asyncio.gather(*(
            client.post("/v1/messages", json={"event_type": "t", "payload": 1}, headers=headers) for _ in range(50)))
        statuses = [response.status for response in responses]
        assert set(statuses) <= {202, 503} and 202 in statuses
        accepted = statuses.count(202)
        for response in responses:
            if response.status == 503:
                assert response.headers["Retry-After"] == "1"
        assert await pool.fetchval("SELECT count(*) FROM messages") == accepted


async def _until(predicate, timeout_seconds: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_seconds
    while not await predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


async def test_a_cancelled_caller_leaves_its_request_and_key_in_flight_until_the_batch_commits(pool, database_url):
    """The client of a keyed request goes away (its handler is cancelled) while the batch waits on the
    account's lock: the same key answers KeyInProgress until that batch commits, the message is written
    exactly once, and the key then replays it."""
    account_id = await _account_with_endpoint(pool, 100)
    coalescer = Coalescer(pool, attempts_max=3, concurrency=1)
    request = messages.MessageRequest(account_id, "t", b"1", "key-1")
    blocker = await asyncpg.connect(database_url)
    try:
        async with blocker.transaction():
            await blocker.execute("SELECT 1 FROM accounts WHERE id = $1 FOR UPDATE", account_id)
            first = asyncio.create_task(coalescer.submit(request))

            async def batch_waits_on_the_lock() -> bool:
                return bool(await pool.fetchval(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()"))

            await _until(batch_waits_on_the_lock)
            first.cancel()
            with pytest.raises(asyncio.CancelledError):
                await first
            with pytest.raises(KeyInProgress):
                # Bounded: a coalescer that let the key go would queue this behind the held lock.
                await asyncio.wait_for(coalescer.submit(request), 5)
            assert await pool.fetchval("SELECT count(*) FROM messages") == 0
        await blocker.close()

        async def written() -> bool:
            return await pool.fetchval("SELECT count(*) FROM messages WHERE idempotency_key = 'key-1'") == 1

        await _until(written)
        replay = await coalescer.submit(request)
        assert replay.replayed
        assert await pool.fetchval("SELECT count(*) FROM messages") == 1
        assert await pool.fetchval("SELECT count(*) FROM ledger_entries WHERE kind = 'charge'") == 1
    finally:
        if not blocker.is_closed():
            await blocker.close()  # releases the lock first if a check above failed, so close() can finish
        await coalescer.close()


async def test_a_kept_connection_the_server_closed_is_not_reused(pool, database_url):
    """Each batch keeps its connection for the next one. When the server ends those connections while
    they wait (a PostgreSQL restart, an idle timeout, pg_terminate_backend), asyncpg hands them back
    to the pool and detaches them; the next batch took one anyway and failed every request in it."""
    account = await _account_with_endpoint(pool, 100)
    coalescer = Coalescer(pool, attempts_max=3, concurrency=2)
    try:
        first = await asyncio.gather(*(coalescer.submit(messages.MessageRequest(account, "t", b"1"))
                                       for _ in range(4)))
        assert all(isinstance(result, messages.MessageCreated) for result in first)
        killer = await asyncpg.connect(database_url)
        try:
            ended = await killer.fetchval(
                "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()) AS t")
        finally:
            await killer.close()
        assert ended >= 1
        await asyncio.sleep(0.3)  # asyncpg reads the server's goodbye
        after = await asyncio.gather(*(coalescer.submit(messages.MessageRequest(account, "t", b"2"))
                                       for _ in range(4)), return_exceptions=True)
        assert all(isinstance(result, messages.MessageCreated) for result in after), after
    finally:
        await coalescer.close()


async def _hold_account_lock(pool, account_id):
    """A connection holding the account's row lock, as a long settle or closeout would."""
    holder = await pool.acquire()
    transaction = holder.transaction()
    await transaction.start()
    await holder.execute("SELECT 1 FROM accounts WHERE id = $1 FOR UPDATE", account_id)
    return holder, transaction


async def test_a_batch_beside_a_running_one_waits_for_enough_requests_or_a_stall(pool):
    """parallel_waiting_min: a lone request does not start a second transaction beside a young one (it
    would be a batch of one); once the running batch has run stall_seconds (here: stuck on a locked
    account), it does start, and commits while the first is still stuck."""
    stuck, free = await _account_with_endpoint(pool, 100), await _account_with_endpoint(pool, 100)
    holder, held = await _hold_account_lock(pool, stuck)
    coalescer = Coalescer(pool, attempts_max=3, concurrency=2, parallel_waiting_min=100, stall_seconds=0.3)
    loop = asyncio.get_running_loop()
    try:
        submitted = loop.time()  # the first batch starts after this, so the stall ends 0.3 s after it at the earliest
        first = asyncio.create_task(coalescer.submit(messages.MessageRequest(stuck, "t", b"1")))
        await asyncio.sleep(0.05)  # the first batch is running, waiting for the lock
        second = await asyncio.wait_for(coalescer.submit(messages.MessageRequest(free, "t", b"2")), 10)
        # It waited for the stall (however slow the machine, not less), and not for the stuck batch,
        # which is still stuck: the lock is held until the test lets it go.
        assert isinstance(second, messages.MessageCreated) and not first.done()
        assert loop.time() - submitted >= 0.3, loop.time() - submitted
    finally:
        await _release_and_close(pool, holder, held, coalescer)
    assert isinstance(await asyncio.wait_for(first, 10), messages.MessageCreated)


async def test_enough_waiting_requests_start_a_second_batch_at_once(pool):
    """With parallel_waiting_min requests waiting, the second transaction starts without waiting for
    the stall time (here far longer than the test)."""
    stuck, free = await _account_with_endpoint(pool, 100), await _account_with_endpoint(pool, 100)
    holder, held = await _hold_account_lock(pool, stuck)
    coalescer = Coalescer(pool, attempts_max=3, concurrency=2, parallel_waiting_min=3, stall_seconds=60)
    try:
        first = asyncio.create_task(coalescer.submit(messages.MessageRequest(stuck, "t", b"1")))
        await asyncio.sleep(0.05)
        lone = asyncio.create_task(coalescer.submit(messages.MessageRequest(free, "t", b"lone")))
        await asyncio.sleep(0.2)
        assert not lone.done() and coalescer.waiting == 1  # below the threshold: it waits
        more = [coalescer.submit(messages.MessageRequest(free, "t", b"%d" % n)) for n in range(2)]
        results = await asyncio.wait_for(asyncio.gather(lone, *more), 10)
        assert all(isinstance(result, messages.MessageCreated) for result in results)
        assert not first.done()
    finally:
        await _release_and_close(pool, holder, held, coalescer)
    assert isinstance(await asyncio.wait_for(first, 10), messages.MessageCreated)


async def test_waiting_requests_weigh_as_many_deliveries_as_the_last_batch_made_per_message(pool):
    """parallel_waiting_min counts deliveries: after a batch at fan-out 4, each waiting request
    weighs 4, so with a threshold of 6 one waiting request still waits beside a stuck batch and two
    start a second transaction at once (at fan-out 1 they would wait for the stall, far longer
    than the test)."""
    stuck, narrow = await _account_with_endpoint(pool, 100), await _account_with_endpoint(pool, 100)
    wide = await _account_with_endpoint(pool, 100)
    for _ in range(3):
        await pool.execute("INSERT INTO endpoints (id, account_id, url) VALUES ($1, $2, 'https://example.com')",
                           uuid.uuid4(), wide)
    coalescer = Coalescer(pool, attempts_max=3, concurrency=2, parallel_waiting_min=6, stall_seconds=60)
    holder = held = None
    try:
        made = await asyncio.wait_for(coalescer.submit(messages.MessageRequest(wide, "t", b"wide")), 10)
        assert len(made.deliveries) == 4
        holder, held = await _hold_account_lock(pool, stuck)
        first = asyncio.create_task(coalescer.submit(messages.MessageRequest(stuck, "t", b"1")))
        await asyncio.sleep(0.05)
        lone = asyncio.create_task(coalescer.submit(messages.MessageRequest(narrow, "t", b"lone")))
        await asyncio.sleep(0.2)
        assert not lone.done() and coalescer.waiting == 1  # 4 deliveries' worth: below 6, it waits
        other = coalescer.submit(messages.MessageRequest(narrow, "t", b"other"))
        results = await asyncio.wait_for(asyncio.gather(lone, other), 10)
        assert all(isinstance(result, messages.MessageCreated) for result in results)
        assert not first.done()
    finally:
        if holder is not None:
            await _release_and_close(pool, holder, held, coalescer)
        else:
            await asyncio.wait_for(coalescer.close(), 10)
    assert isinstance(await asyncio.wait_for(first, 10), messages.MessageCreated)


async def _release_and_close(pool, holder, held, coalescer) -> None:
    """Let the stuck batch go and close the coalescer, which returns its connections (a failed
    assertion must not leave them held: the pool's teardown would wait for them)."""
    await _let_go(pool, holder, held)
    await asyncio.wait_for(coalescer.close(), 10)


async def test_the_group_commit_plans_generically_and_leaves_the_pool_as_it_was(pool):
    """A batch of one was planned anew at every execution (its custom plan looks cheaper than the
    generic one): a third of PostgreSQL's CPU for a lone create. The group commit's connections run
    the generic plan; one given back to the pool is reset, so other users plan as before."""
    account = await _account_with_endpoint(pool, 100)
    coalescer = Coalescer(pool, attempts_max=3, concurrency=1)
    try:
        for number in range(8):  # past PostgreSQL's five custom plans, each a batch of one
            created = await coalescer.submit(messages.MessageRequest(account, "t", b"%d" % number))
            assert isinstance(created, messages.MessageCreated)
        (kept,) = coalescer._connections
        assert await kept.fetchval("SHOW plan_cache_mode") == "force_generic_plan"
        plans = await kept.fetchrow("SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE statement = $1",
                                    message_direct.DIRECT_WRITE)
        assert (plans["generic_plans"], plans["custom_plans"]) == (8, 0)
    finally:
        await coalescer.close()
    async with pool.acquire() as connection:
        assert await connection.fetchval("SHOW plan_cache_mode") == "auto"



async def test_the_next_batch_is_on_its_way_before_the_last_one_is_answered(pool):
    """Early send: when the only batch in flight answers, the requests that waited for it are taken
    into the next batch before its own callers resume, so PostgreSQL writes them while this process
    answers those callers. Here the first batch is stuck on a locked account while three requests
    wait behind it (far below the threshold for a second batch, with a stall longer than the test);
    the moment its caller resumes, nothing waits any more. Without the early send the three were
    still waiting then, taken only after the last batch's callers had run."""
    stuck, free = await _account_with_endpoint(pool, 100), await _account_with_endpoint(pool, 100)
    holder, held = await _hold_account_lock(pool, stuck)
    coalescer = Coalescer(pool, attempts_max=3, concurrency=2, parallel_waiting_min=100, stall_seconds=60)
    try:
        first = asyncio.create_task(_submit_and_look(coalescer, messages.MessageRequest(stuck, "t", b"first")))
        await asyncio.sleep(0.05)  # the first batch is running, waiting for the lock
        behind = [asyncio.create_task(coalescer.submit(messages.MessageRequest(free, "t", b"%d" % n)))
                  for n in range(3)]
        await asyncio.sleep(0.1)
        assert coalescer.waiting == 3 and not first.done()
        await held.rollback()  # the first batch commits
        result, waiting_when_answered = await asyncio.wait_for(first, 10)
        assert isinstance(result, messages.MessageCreated)
        assert waiting_when_answered == 0
        made = await asyncio.wait_for(asyncio.gather(*behind), 10)
        assert all(isinstance(one, messages.MessageCreated) for one in made)
    finally:
        await _release_and_close(pool, holder, held, coalescer)


STALL_SECONDS = 2.0


async def test_beside_another_running_batch_an_answered_one_sends_nothing_early(pool):
    """The early send is for a batch alone in flight: one that answers while another is still stuck
    leaves the requests behind it to the threshold or the stall, as before. The second batch (stuck
    on a second locked account) answers beside the stuck first; when its caller resumes, the third
    request still waits, and goes on its own afterwards."""
    stuck, slow = await _account_with_endpoint(pool, 100), await _account_with_endpoint(pool, 100)
    free = await _account_with_endpoint(pool, 100)
    holder, held = await _hold_account_lock(pool, stuck)
    slow_holder, slow_held = await _hold_account_lock(pool, slow)
    # The checks "before the stall" must run within the stall of the batch before them: a few event
    # loop turns and a commit, which a loaded machine can stretch far past a fraction of a second.
    coalescer = Coalescer(pool, attempts_max=3, concurrency=2, parallel_waiting_min=100, stall_seconds=STALL_SECONDS)
    try:
        first = asyncio.create_task(coalescer.submit(messages.MessageRequest(stuck, "t", b"1")))
        await asyncio.sleep(0.05)
        second = asyncio.create_task(_submit_and_look(coalescer, messages.MessageRequest(slow, "t", b"2")))
        await asyncio.sleep(0.05)
        assert coalescer.waiting == 1  # below the threshold, before the stall
        await _until(_no_request_waits(coalescer))  # the second batch started at the stall, stuck too
        third = asyncio.create_task(coalescer.submit(messages.MessageRequest(free, "t", b"3")))
        await asyncio.sleep(0.05)
        assert coalescer.waiting == 1
        await slow_held.rollback()
        result, waiting_when_answered = await asyncio.wait_for(second, 10)
        assert isinstance(result, messages.MessageCreated)
        assert waiting_when_answered == 1  # not taken early beside the stuck first batch
        assert isinstance(await asyncio.wait_for(third, 10), messages.MessageCreated)
        assert not first.done()
    finally:
        await _let_go(pool, slow_holder, slow_held)
        await _release_and_close(pool, holder, held, coalescer)
    assert isinstance(await asyncio.wait_for(first, 10), messages.MessageCreated)


async def _submit_and_look(coalescer: Coalescer, request: messages.MessageRequest):
    """The request's result, and how many requests waited at the moment its caller resumed (read in
    the same step of the loop)."""
    result = await coalescer.submit(request)
    return result, coalescer.waiting


def _no_request_waits(coalescer: Coalescer):
    async def predicate() -> bool:
        return coalescer.waiting == 0
    return predicate


async def _let_go(pool, holder, held) -> None:
    """End a lock holder's transaction unless the test already did, and give its connection back."""
    if holder.is_in_transaction():
        await held.rollback()
    await pool.release(holder)


@pytest.mark.parametrize("round_number", range(5))
async def test_closed_loops_of_callers_each_get_their_own_result_and_the_ledger_agrees(pool, round_number):
    """24 callers each submit 15 creates one after another (as a benchmark's connections do), over a
    hot account, two others and one that can pay for 20: while a batch runs the next callers queue,
    so batches are sent early, before the last one's callers resume. Every caller gets its own
    result, the poor account exactly 20 messages and then refusals, each balance equals its ledger,
    and the audit is clean."""
    hot = await _account_with_endpoint(pool, 1000)
    others = [await _account_with_endpoint(pool, 1000) for _ in range(2)]
    poor = await _account_with_endpoint(pool, 20)
    coalescer = Coalescer(pool, attempts_max=3)
    targets = [hot, hot, *others, poor]

    async def caller(number: int) -> list:
        results = []
        for turn in range(15):
            account = targets[(number + turn) % len(targets)]
            results.append((account, await coalescer.submit(messages.MessageRequest(account, "t", b"%d" % turn))))
        return results

    try:
        outcomes = [each for results in await asyncio.wait_for(
            asyncio.gather(*(caller(number) for number in range(24))), 60) for each in results]
    finally:
        await asyncio.wait_for(coalescer.close(), 10)
    assert len(outcomes) == 24 * 15
    created = [result for _, result in outcomes if isinstance(result, messages.MessageCreated)]
    assert len({result.message_id for result in created}) == len(created)
    assert all(isinstance(result, InsufficientBalance) for account, result in outcomes
               if not isinstance(result, messages.MessageCreated) and account == poor)
    assert sum(1 for account, result in outcomes if account != poor and not isinstance(result, messages.MessageCreated)) == 0
    assert sum(1 for result in created if result.account_id == poor) == 20
    for account in (hot, *others, poor):
        made = sum(1 for result in created if result.account_id == account)
        stored = await pool.fetchrow(
            "SELECT a.balance, (SELECT sum(amount) FROM ledger_entries l WHERE l.account_id = a.id) AS ledger,"
            " (SELECT count(*) FROM messages m WHERE m.account_id = a.id) AS messages FROM accounts a WHERE a.id = $1",
            account)
        assert stored["balance"] == stored["ledger"]
        assert stored["messages"] == made
    assert (await audit(pool)).clean
