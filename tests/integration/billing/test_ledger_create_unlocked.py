"""The unlocked create (billing.messages): the read locks nothing, and the one write statement
writes the batch only if every account still passes what was decided from that read, else nothing,
and the batch is decided again, locked. Real database, concurrent connections.

A batch goes direct first (billing.message_direct, tested in test_ledger_create_direct.py) unless
a request targets endpoints of its own, as a replay does; the requests here target theirs, so
they go the unlocked way (the race at the end mixes both kinds of batch).

Each test makes an account change between the read and the write for certain, by holding the
account's row lock in a transaction of its own until the write waits on it; the race at the end
makes it happen by chance, many times."""

from __future__ import annotations

import asyncio
import random
from collections import Counter

import asyncpg

from billing import messages
from billing.errors import AccountNotActive, InsufficientBalance
from ledger_helpers import add_endpoint, assert_audit_clean, balance, holding_account_lock, ledger_sum, make_account

RACE_ROUNDS = 12


def _holding(pool: asyncpg.Pool, account_id, creates: list, then: str | None = None):
    """Run `creates` while a transaction holds the account's row lock; once their unlocked writes
    wait on it, run the statement `then` (given the account id) in that transaction and commit."""
    change = None if then is None else (lambda holder: holder.execute(then, account_id))
    return holding_account_lock(pool, account_id, creates, waiting="WITH locked AS", then=change)


async def test_an_account_repriced_between_read_and_write_is_charged_the_new_price(pool):
    account_id = await make_account(pool, balance=100, price=1)
    endpoint_id = await add_endpoint(pool, account_id)
    before = messages.WRITES.copy()
    request = messages.MessageRequest(account_id, "t", b"1", endpoint_ids=(endpoint_id,))
    (created,) = await _holding(pool, account_id, [messages.create_message(pool, request, attempts_max=2)],
                                "UPDATE accounts SET price_per_delivery = 2 WHERE id = $1")
    assert created.total_charged == 2 and [delivery.price for delivery in created.deliveries] == [2]
    assert await balance(pool, account_id) == await ledger_sum(pool, account_id) == 98
    assert messages.WRITES - before == Counter({"fell_back": 1})
    await assert_audit_clean(pool, account_id)


async def test_an_account_closed_between_read_and_write_writes_nothing(pool):
    account_id = await make_account(pool, balance=100, price=1)
    endpoint_id = await add_endpoint(pool, account_id)
    request = messages.MessageRequest(account_id, "t", b"1", endpoint_ids=(endpoint_id,))
    (refused,) = await _holding(pool, account_id, [messages.create_messages(pool, [request], attempts_max=2)],
                                "UPDATE accounts SET status = 'closing' WHERE id = $1")
    assert isinstance(refused[0], AccountNotActive), refused
    assert await pool.fetchval("SELECT count(*) FROM messages WHERE account_id = $1", account_id) == 0
    assert await balance(pool, account_id) == 100


async def test_one_key_in_two_unlocked_writes_charges_once(pool):
    """Both read before either wrote, so both plan a new message for the key: the second write
    fails on the unique index, writes nothing, and its batch, decided again, replays the first and
    writes the batch's other message."""
    account_id = await make_account(pool, balance=100, price=1)
    targets = (await add_endpoint(pool, account_id),)
    request = messages.MessageRequest(account_id, "t", b"1", "same-key", endpoint_ids=targets)
    before, refused_before = messages.WRITES.copy(), messages.REFUSED.copy()
    first, second = await _holding(pool, account_id, [
        messages.create_messages(pool, [request, messages.MessageRequest(account_id, "t", b"2", endpoint_ids=targets)],
                                 attempts_max=2),
        messages.create_messages(pool, [request, messages.MessageRequest(account_id, "t", b"3", endpoint_ids=targets)],
                                 attempts_max=2)])
    created = [result for result in (first[0], second[0]) if not result.replayed]
    replayed = [result for result in (first[0], second[0]) if result.replayed]
    assert len(created) == 1 and len(replayed) == 1 and replayed[0].message_id == created[0].message_id
    assert not first[1].replayed and not second[1].replayed
    assert await pool.fetchval("SELECT count(*) FROM messages WHERE account_id = $1", account_id) == 3
    assert await balance(pool, account_id) == 97
    assert messages.WRITES - before == Counter({"unlocked": 1, "fell_back": 1})
    assert messages.REFUSED - refused_before == Counter({"UniqueViolationError": 1})
    await assert_audit_clean(pool, account_id)


async def test_a_balance_spent_between_read_and_write_is_never_overspent(pool):
    """Two batches read a balance of 3 and each plans to spend 2: the second write finds 1 left,
    writes nothing, and decided again, locked, refuses what 1 cannot cover."""
    account_id = await make_account(pool, balance=3, price=1)
    targets = (await add_endpoint(pool, account_id),)
    batches = [[messages.MessageRequest(account_id, "t", b"%d-%d" % (batch, n), endpoint_ids=targets) for n in range(2)]
               for batch in range(2)]
    first, second = await _holding(pool, account_id, [
        messages.create_messages(pool, batch, attempts_max=2) for batch in batches])
    outcomes = Counter(type(result).__name__ for result in first + second)
    assert outcomes == Counter({"MessageCreated": 3, "InsufficientBalance": 1}), outcomes
    assert await balance(pool, account_id) == await ledger_sum(pool, account_id) == 0
    await assert_audit_clean(pool, account_id)


async def test_concurrent_batches_on_few_accounts_never_overspend(pool):
    """Eight writers send batches over three accounts with small balances while their prices change,
    RACE_ROUNDS times. No top-ups, so a balance only falls: ending at or above zero, it never went
    below. Each account's balance fell by exactly what its created messages were charged, the
    ledger agrees, and every way of writing ran: half the batches target each account's catch-all
    endpoint (the planned ways), half do not (direct first)."""
    rng = random.Random(5)
    before, declined_before, refused_before = messages.WRITES.copy(), messages.DECLINED.copy(), messages.REFUSED.copy()
    refused = 0
    for _ in range(RACE_ROUNDS):
        account_ids = [await make_account(pool, balance=rng.randint(8, 30), price=1) for _ in range(3)]
        catch_all = {}
        for account_id in account_ids:
            catch_all[account_id] = await add_endpoint(pool, account_id)
            await add_endpoint(pool, account_id, event_types=["b"])
        initial = {account_id: await balance(pool, account_id) for account_id in account_ids}
        charged = Counter()

        async def writer(number: int) -> None:
            nonlocal refused
            for n in range(6):
                targeted = rng.random() < 0.5
                batch = []
                for k in range(rng.randint(1, 6)):
                    account_id = rng.choice(account_ids)
                    batch.append(messages.MessageRequest(
                        account_id, rng.choice("ab"), b"%d-%d-%d" % (number, n, k),
                        endpoint_ids=(catch_all[account_id],) if targeted else None))
                for request, result in zip(batch, await messages.create_messages(pool, batch, attempts_max=2),
                                           strict=True):
                    if isinstance(result, messages.MessageCreated):
                        charged[request.account_id] += result.total_charged
                    else:
                        assert isinstance(result, InsufficientBalance), result
                        refused += 1

        async def repricer() -> None:
            for _ in range(10):
                await pool.execute("UPDATE accounts SET price_per_delivery = $2 WHERE id = $1",
                                   rng.choice(account_ids), rng.choice([1, 2]))
                await asyncio.sleep(0.002)

        await asyncio.gather(*(writer(number) for number in range(8)), repricer())
        for account_id in account_ids:
            final = await balance(pool, account_id)
            assert final >= 0 and initial[account_id] - final == charged[account_id], (initial, final, charged)
            assert final == await ledger_sum(pool, account_id)
            assert await pool.fetchval(
                "SELECT coalesce(sum(price), 0) FROM deliveries WHERE account_id = $1", account_id) == charged[account_id]
            await assert_audit_clean(pool, account_id)
    writes, declined = messages.WRITES - before, messages.DECLINED - declined_before
    print(f"\nunlocked and direct race: {dict(writes)}, declined {dict(declined)}, {refused} refused for balance")
    assert writes["direct"] > 0 and writes["unlocked"] > 0 and writes["fell_back"] > 0 and refused > 0, (writes, refused)
    assert messages.REFUSED == refused_before  # no write failed: no deadlock, no error, only balances
    assert declined["not_ok"] > 0 and set(declined) == {"not_ok"}, declined
