"""A claim given back unsent (record_results: released) racing the sweep and other workers, on real PostgreSQL.

A worker whose send could no longer end within its lease gives the claim back with its attempt
(`_RELEASE`: pending, attempt - 1), quoting the attempt and `sending`. The sequential test
(test_engine_lease_deadline) shows the fence matches nothing once the lease expired and the
delivery moved on. Here the writers run at the same time, each on a connection of its own:

1. the release of attempt k against the sweep returning the expired lease to pending: one of the
   two takes the delivery, never both;
2. the release of attempt k against another worker claiming the swept delivery (attempt k + 1):
   the release never undoes that claim;
3. all three at once.

Each race runs ROUNDS rounds, one fresh delivery each, going through its schedules in turn: all
writers let go together at a barrier (with a little random jitter, so either may win), or one
writer held inside its UPDATE, the row locked and not committed, while another arrives (which
must then wait for the row, or skip it, and afterwards see what the first wrote). The hold is a
trigger installed in this test's own database that takes a shared advisory lock, which the test
holds while it wants that kind of write paused; the production statements run unchanged. After
every round the delivery is in one consistent state, its attempts agree with it, it still has
one charge and no refund, and the audit is clean.

Race 1 is what the state fence (`state = 'sending'`) is for: the attempt does not move there.
Races 2 and 3 need the attempt fence as well.
"""

from __future__ import annotations

import asyncio
import random
import uuid

import pytest

from billing.audit import audit
from billing.database import create_pool
from billing.messages import MessageRequest, create_message
from delivery.engine import claims
from delivery.engine.results import LEASE_EXPIRED_ERROR, AttemptResult, expire_leases, record_results
from engine_helpers import PRICE, add_account, add_endpoint, ledger_of, keys_of

ROUNDS = 40
LEASE_MS = 60_000
K = 2  # the attempt the releasing worker holds; attempt 1 was sent and answered 500
ATTEMPTS_MAX = 3  # so that another worker may still claim attempt K + 1
WAIT_SECONDS = 5.0

# The writes a held writer may be paused in, told apart by what they do to the row.
GATE = 7_305_001
RELEASE, CLAIM, EXPIRY = 1, 2, 3
_HOLD_FUNCTION = f"""
CREATE FUNCTION test_hold_while_gated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock_shared({GATE}, CASE
        WHEN NEW.attempt < OLD.attempt THEN {RELEASE}
        WHEN NEW.attempt > OLD.attempt THEN {CLAIM}
        ELSE {EXPIRY} END);
    RETURN NULL;
END $$
"""
_HOLD_TRIGGER = (
    "CREATE TRIGGER test_hold_while_gated AFTER UPDATE ON deliveries"
    " FOR EACH ROW EXECUTE FUNCTION test_hold_while_gated()"
)
_WAITING = (
    "SELECT count(*) FROM pg_stat_activity"
    " WHERE datname = current_database() AND wait_event_type = 'Lock' AND wait_event = ANY($1::text[])"
)
ON_GATE = ["advisory"]
ON_ROW = ["transactionid", "tuple"]


@pytest.fixture
async def racers(database_url):
    """Three pools of one connection each (the releasing worker, the sweep, the other worker),
    and a gate connection that holds writers inside their UPDATE."""
    gate_pool = await create_pool(database_url, size_min=1, size_max=1)
    pools = [await create_pool(database_url, size_min=1, size_max=1) for _ in range(3)]
    try:
        async with gate_pool.acquire() as connection:
            await connection.execute(_HOLD_FUNCTION)
            await connection.execute(_HOLD_TRIGGER)
            try:
                yield Racers(*pools, Gate(connection))
            finally:
                await connection.execute("SELECT pg_advisory_unlock_all()")  # a failed round holds no writer
    finally:
        for racer_pool in (gate_pool, *pools):
            await racer_pool.close()


class Gate:
    """Holds the writes of one kind inside their UPDATE (row locked, not committed) while held."""

    def __init__(self, connection) -> None:
        self.connection = connection

    async def hold(self, kind: int) -> None:
        await self.connection.execute("SELECT pg_advisory_lock($1, $2)", GATE, kind)

    async def let_go(self, kind: int) -> None:
        assert await self.connection.fetchval("SELECT pg_advisory_unlock($1, $2)", GATE, kind)

    async def wait_until_waiting(self, events: list[str], count: int = 1) -> None:
        """Until `count` backends of this database wait on a lock of these kinds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + WAIT_SECONDS
        while await self.connection.fetchval(_WAITING, events) < count:
            assert loop.time() < deadline, f"no writer waited on {events} within {WAIT_SECONDS} s"
            await asyncio.sleep(0.001)


class Racers:
    def __init__(self, worker_pool, sweep_pool, other_pool, gate: Gate) -> None:
        self.worker, self.sweep, self.other, self.gate = worker_pool, sweep_pool, other_pool, gate


async def _at_once(awaitable, what: str):
    """`awaitable`'s result, which must come without waiting for the row a held writer has locked."""
    try:
        return await asyncio.wait_for(awaitable, WAIT_SECONDS)
    except asyncio.TimeoutError:
        raise AssertionError(f"{what} waited for the row another writer holds (SKIP LOCKED?)") from None


async def _account(pool, receiver_factory, keyring) -> uuid.UUID:
    account_id = await add_account(pool, balance=PRICE * (ROUNDS + 5))
    await add_endpoint(pool, account_id, await receiver_factory(), keyring)
    return account_id


async def _leased_past_its_end(pool, account_id) -> uuid.UUID:
    """A delivery `sending` on attempt K (attempt 1 sent and failed) whose lease has expired."""
    created = await create_message(pool, MessageRequest(account_id, "e", b"{}"), attempts_max=ATTEMPTS_MAX)
    delivery_id = created.deliveries[0].id
    (first,) = await claims.claim_ids(pool, await keys_of(pool, [delivery_id]), lease_ms=LEASE_MS)
    failed = await record_results(pool, [AttemptResult(delivery_id, first.attempt, account_id, False, 12, 500,
                                                       "HTTP 500", retry_delay_seconds=0.0)])
    assert failed.retrying == [delivery_id]
    (second,) = await claims.claim_ids(pool, await keys_of(pool, [delivery_id]), lease_ms=LEASE_MS)
    assert second.attempt == K
    await pool.execute("UPDATE deliveries SET leased_until = now() - interval '1 second' WHERE id = $1", delivery_id)
    return delivery_id


async def _swept(pool, account_id) -> uuid.UUID:
    """A delivery whose lease on attempt K expired and that the sweep returned to pending, due now."""
    delivery_id = await _leased_past_its_end(pool, account_id)
    assert await _sweep(pool) == [delivery_id]
    return delivery_id


async def _release(pool, delivery_id, account_id) -> list[uuid.UUID]:
    """The releasing worker gives back its claim on attempt K; returns what was released."""
    summary = await record_results(pool, [AttemptResult(delivery_id, K, account_id, False, 0, released=True)])
    return summary.released


async def _sweep(pool) -> list[uuid.UUID]:
    return await expire_leases(pool, batch_size=claims.CLAIM_BATCH_MAX, delay_seconds=lambda attempt: 0.0)


async def _claim(pool, delivery_id) -> claims.Claimed | None:
    loaded = await claims.claim_ids_for_send(pool, await keys_of(pool, [delivery_id]), lease_ms=LEASE_MS)
    return loaded[0][0] if loaded else None


async def _claim_while(pool, delivery_id, racing: list[asyncio.Future]) -> claims.Claimed | None:
    """Another worker that keeps trying to claim the delivery while the other writers run."""
    while True:
        claimed = await _claim(pool, delivery_id)
        if claimed is not None or all(task.done() for task in racing):
            return claimed
        await asyncio.sleep(0)


async def _after(barrier: asyncio.Event, rng: random.Random, call):
    """Run `call` once the barrier opens, after a random moment of up to 2 ms (so either may win)."""
    await barrier.wait()
    await asyncio.sleep(rng.choice((0, 0, 0.0005, 0.001, 0.002)))
    return await call()


async def _together(rng: random.Random, *calls):
    """Run the calls at once, each on its own connection, let go together at one barrier."""
    barrier = asyncio.Event()
    tasks = [asyncio.create_task(_after(barrier, rng, call)) for call in calls]
    await asyncio.sleep(0)
    barrier.set()
    return await asyncio.gather(*tasks)


async def _assert_sound(pool, delivery_id, account_id, *, attempt: int, claimed: claims.Claimed | None,
                        lease_expired: bool, label: str) -> None:
    """The delivery is in the one state its winner left (pending on `attempt` without a lease, or
    `sending` on the claimer's attempt under its lease), its attempts agree, its ledger and the audit hold."""
    row = await pool.fetchrow(
        "SELECT state, attempt, leased_until IS NOT NULL AS leased, leased_until > now() AS lease_live,"
        " next_attempt_at <= now() AS due FROM deliveries WHERE id = $1", delivery_id)
    if claimed is None:
        assert (row["state"], row["attempt"], row["leased"]) == ("pending", attempt, False), (label, dict(row))
        assert row["due"], (label, dict(row))
    else:
        assert claimed.attempt == attempt + 1, (label, claimed)
        assert (row["state"], row["attempt"], row["lease_live"]) == ("sending", claimed.attempt, True), \
            (label, dict(row), "the other worker's claim was undone")
    assert row["attempt"] >= K - 1, (label, "the attempt went below the one that was sent")
    recorded = await pool.fetch(
        "SELECT attempt, account_id, status_code, error, stale FROM delivery_attempts WHERE delivery_id = $1"
        " ORDER BY attempt", delivery_id)
    expected = [(1, account_id, 500, "HTTP 500", False)]
    if lease_expired:
        expected.append((K, account_id, None, LEASE_EXPIRED_ERROR, False))
    assert [tuple(r) for r in recorded] == expected, (label, [tuple(r) for r in recorded])
    assert max(r["attempt"] for r in recorded) <= row["attempt"], (label, "an attempt recorded beyond the delivery's")
    assert await ledger_of(pool, delivery_id) == {"charge": -PRICE}, label
    assert (await audit(pool)).violations == [], label


async def _assert_the_claim_holds(pool, delivery_id, account_id, claimed: claims.Claimed | None, label: str) -> None:
    """The other worker's claim is its own: its result is recorded, not stale."""
    if claimed is None:
        return
    summary = await record_results(pool, [AttemptResult(delivery_id, claimed.attempt, account_id, True, 7, 200)])
    assert summary.delivered == [delivery_id] and summary.stale == [], (label, summary)
    assert await ledger_of(pool, delivery_id) == {"charge": -PRICE}, label
    assert (await audit(pool)).violations == [], label


def _schedules(names: tuple[str, ...]):
    return [(number, names[number % len(names)]) for number in range(ROUNDS)]


async def _second_waits_on_the_row(gate, kind: int, first, second) -> tuple:
    """`first` held inside its UPDATE (the gate's `kind`), its row locked and not committed;
    `second` arrives and waits for that row; then `first` is let go. (second's, first's) results."""
    await gate.hold(kind)
    firsts = asyncio.create_task(first())
    await gate.wait_until_waiting(ON_GATE)
    seconds = asyncio.create_task(second())
    await gate.wait_until_waiting(ON_ROW)
    await gate.let_go(kind)
    return tuple(await asyncio.gather(seconds, firsts))


async def test_a_release_racing_the_lease_expiry_is_taken_or_fenced_never_both(pool, racers, receiver_factory, keyring):
    """Race 1: the lease of attempt K has expired; the releasing worker gives the claim back while
    the sweep returns the lease to pending. Exactly one of them takes the delivery: released
    (pending on K - 1, no attempt K recorded) or expired (pending on K, attempt K recorded as a
    lease expiry, the release matching nothing). Never the release applied over the expiry,
    which would record an attempt beyond the delivery's. (A release still applies after the
    lease's end while the sweep has not expired it: only the sweep may touch a `sending` row then,
    and the two exclude each other on the row.)"""
    account_id = await _account(pool, receiver_factory, keyring)
    rng = random.Random(1)
    seen = set()
    for number, schedule in _schedules(("together", "release holds the row", "sweep holds the row")):
        delivery_id = await _leased_past_its_end(pool, account_id)
        release = lambda: _release(racers.worker, delivery_id, account_id)  # noqa: E731
        sweep = lambda: _sweep(racers.sweep)  # noqa: E731
        if schedule == "together":
            released, swept = await _together(rng, release, sweep)
        elif schedule == "release holds the row":
            await racers.gate.hold(RELEASE)
            releasing = asyncio.create_task(release())
            await racers.gate.wait_until_waiting(ON_GATE)
            swept = await _at_once(sweep(), "the sweep")  # SKIP LOCKED: it does not wait for the release
            await racers.gate.let_go(RELEASE)
            released = await releasing
        else:
            released, swept = await _second_waits_on_the_row(racers.gate, EXPIRY, sweep, release)
        label = f"round {number} ({schedule}): released {released}, swept {swept}"
        assert (released == [delivery_id]) != (swept == [delivery_id]), label
        assert set(released) | set(swept) == {delivery_id}, label
        expired = swept == [delivery_id]
        seen.add("expired" if expired else "released")
        await _assert_sound(pool, delivery_id, account_id, attempt=K if expired else K - 1, claimed=None,
                            lease_expired=expired, label=label)
    assert seen == {"released", "expired"}, seen


async def test_a_release_racing_another_workers_claim_never_undoes_it(pool, racers, receiver_factory, keyring):
    """Race 2: the sweep has returned the expired lease of attempt K to pending; the releasing
    worker, late, gives its claim back while another worker claims the delivery (attempt K + 1).
    The release matches nothing: the delivery stays pending on K, or is `sending` on K + 1 under
    the other worker's lease, whose result then records (not stale). Fenced by the attempt when
    the claim commits first, by the state otherwise."""
    account_id = await _account(pool, receiver_factory, keyring)
    rng = random.Random(2)
    claimed_rounds = 0
    for number, schedule in _schedules(("together", "claim holds the row")):
        delivery_id = await _swept(pool, account_id)
        release = lambda: _release(racers.worker, delivery_id, account_id)  # noqa: E731
        claim = lambda: _claim(racers.other, delivery_id)  # noqa: E731
        if schedule == "together":
            released, claimed = await _together(rng, release, claim)
        else:
            released, claimed = await _second_waits_on_the_row(racers.gate, CLAIM, claim, release)
            assert claimed is not None, f"round {number}: the held claim took nothing"
        label = f"round {number} ({schedule}): released {released}, claimed {claimed}"
        assert released == [], label
        claimed_rounds += claimed is not None
        await _assert_sound(pool, delivery_id, account_id, attempt=K, claimed=claimed, lease_expired=True,
                            label=label)
        await _assert_the_claim_holds(pool, delivery_id, account_id, claimed, label)
    assert claimed_rounds >= ROUNDS // 2


async def test_a_release_the_lease_expiry_and_another_worker_at_once(pool, racers, receiver_factory, keyring):
    """Race 3: the lease of attempt K has expired; the releasing worker gives the claim back, the
    sweep expires the lease and another worker keeps trying to claim the delivery, all at once.
    Exactly one of the release and the expiry applies; a claim that follows takes the next
    attempt of what it found (K after the release, K + 1 after the expiry) and is never undone,
    also when it holds the row while the release arrives."""
    account_id = await _account(pool, receiver_factory, keyring)
    rng = random.Random(3)
    seen = set()
    schedules = ("together", "release holds the row", "sweep holds the row", "claim holds the row")
    for number, schedule in _schedules(schedules):
        delivery_id = await _leased_past_its_end(pool, account_id)
        released, swept, claimed = await _three_writers(racers, rng, schedule, delivery_id, account_id)
        label = f"round {number} ({schedule}): released {released}, swept {swept}, claimed {claimed}"
        assert (released == [delivery_id]) != (swept == [delivery_id]), label
        expired = swept == [delivery_id]
        seen.add((schedule, "expired" if expired else "released", claimed is not None))
        await _assert_sound(pool, delivery_id, account_id, attempt=K if expired else K - 1, claimed=claimed,
                            lease_expired=expired, label=label)
        await _assert_the_claim_holds(pool, delivery_id, account_id, claimed, label)
    assert {outcome for _, outcome, _ in seen} == {"released", "expired"}, seen
    assert ("claim holds the row", "expired", True) in seen, seen


async def _three_writers(racers, rng, schedule, delivery_id, account_id):
    """The release, the sweep and a claimer that keeps trying while they run, in one schedule:
    returns (released, swept, claimed)."""
    release = lambda: _release(racers.worker, delivery_id, account_id)  # noqa: E731
    sweep = lambda: _sweep(racers.sweep)  # noqa: E731
    gate = racers.gate
    if schedule == "together":
        barrier = asyncio.Event()
        releasing, sweeping = (asyncio.create_task(_after(barrier, rng, call)) for call in (release, sweep))
        claiming = asyncio.create_task(
            _after(barrier, rng, lambda: _claim_while(racers.other, delivery_id, [releasing, sweeping])))
        await asyncio.sleep(0)
        barrier.set()
    elif schedule == "release holds the row":
        await gate.hold(RELEASE)
        releasing = asyncio.create_task(release())
        await gate.wait_until_waiting(ON_GATE)
        sweeping = asyncio.create_task(sweep())
        claiming = asyncio.create_task(_claim_while(racers.other, delivery_id, [releasing, sweeping]))
        await _at_once(asyncio.shield(sweeping), "the sweep")  # SKIP LOCKED: it does not wait for the release
        await gate.let_go(RELEASE)
    elif schedule == "sweep holds the row":
        await gate.hold(EXPIRY)
        sweeping = asyncio.create_task(sweep())
        await gate.wait_until_waiting(ON_GATE)
        releasing = asyncio.create_task(release())
        claiming = asyncio.create_task(_claim_while(racers.other, delivery_id, [releasing, sweeping]))
        await gate.wait_until_waiting(ON_ROW)  # the release waits for the sweep's row
        await gate.let_go(EXPIRY)
    else:  # the claim, right after the expiry, holds the row when the release arrives
        await gate.hold(CLAIM)
        not_started = asyncio.get_running_loop().create_future()  # the release, until it starts
        sweeping = asyncio.create_task(sweep())
        claiming = asyncio.create_task(_claim_while(racers.other, delivery_id, [not_started, sweeping]))
        await gate.wait_until_waiting(ON_GATE)
        releasing = asyncio.create_task(release())
        await gate.wait_until_waiting(ON_ROW)  # the release waits for the claim's row
        await gate.let_go(CLAIM)
        not_started.set_result(None)
    released, swept = await asyncio.gather(releasing, sweeping)
    return released, swept, await claiming
