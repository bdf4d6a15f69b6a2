"""A replay is written with the webhook-id of the delivery it replays, by every way a batch is
written: the unlocked planned write and the locked one (inside a caller's transaction). A chain
of replays keeps the first one's id; a delivery that replays none, in the same batch or not,
keeps NULL (its own id); and a replay_of naming another account's delivery takes nothing from it.
The charge of each replay is its own, as for any delivery."""

from __future__ import annotations

from billing.audit import audit
from billing.messages import MessageRequest, create_messages
from ledger_helpers import add_endpoint, make_account

ATTEMPTS_MAX = 3


async def _one(pool_or_connection, request: MessageRequest):
    (result,) = await create_messages(pool_or_connection, [request], attempts_max=ATTEMPTS_MAX)
    return result.deliveries[0].id


async def _webhook_ids(pool, delivery_ids) -> dict:
    rows = await pool.fetch("SELECT id, webhook_id FROM deliveries WHERE id = ANY($1::uuid[])", list(delivery_ids))
    return {row["id"]: row["webhook_id"] for row in rows}


async def test_replays_take_the_first_webhook_id_of_their_chain_by_every_write(pool):
    """original -> replay (unlocked) -> replay of the replay (locked, in a transaction): both go out
    under the original's id; a plain message in the replay's batch keeps NULL; each is charged."""
    account_id = await make_account(pool, balance=100, price=2)
    endpoint_id = await add_endpoint(pool, account_id)
    original = await _one(pool, MessageRequest(account_id, "invoice.paid", b"{}"))
    first_replay, plain = [result.deliveries[0].id for result in await create_messages(pool, [
        MessageRequest(account_id, "invoice.paid", b"{}", endpoint_ids=(endpoint_id,), replay_of=original),
        MessageRequest(account_id, "invoice.paid", b'{"n": 2}'),
    ], attempts_max=ATTEMPTS_MAX)]
    async with pool.acquire() as connection, connection.transaction():
        second_replay = await _one(connection, MessageRequest(account_id, "invoice.paid", b"{}",
                                                              endpoint_ids=(endpoint_id,), replay_of=first_replay))
    found = await _webhook_ids(pool, (original, first_replay, plain, second_replay))
    assert found == {original: None, first_replay: original, plain: None, second_replay: original}
    charges = await pool.fetch("SELECT delivery_id, amount FROM ledger_entries WHERE kind = 'charge'"
                               " AND delivery_id = ANY($1::uuid[])", [first_replay, second_replay])
    assert sorted((row["delivery_id"], row["amount"]) for row in charges) == sorted(
        [(first_replay, -2), (second_replay, -2)])
    assert (await audit(pool)).clean


async def test_a_replay_of_a_replay_made_before_webhook_id_existed_keeps_that_ones_own_id(pool):
    """A replay whose webhook_id is NULL (made before the column, sent under its own id) is what a
    replay of it is sent under: the id it went out with, not its replay_of's."""
    account_id = await make_account(pool, balance=100)
    endpoint_id = await add_endpoint(pool, account_id)
    original = await _one(pool, MessageRequest(account_id, "invoice.paid", b"{}"))
    old_replay = await _one(pool, MessageRequest(account_id, "invoice.paid", b"{}", endpoint_ids=(endpoint_id,),
                                                  replay_of=original))
    await pool.execute("UPDATE deliveries SET webhook_id = NULL WHERE id = $1", old_replay)  # as made before 0013
    replay = await _one(pool, MessageRequest(account_id, "invoice.paid", b"{}", endpoint_ids=(endpoint_id,),
                                             replay_of=old_replay))
    assert (await _webhook_ids(pool, [replay]))[replay] == old_replay


async def test_a_replay_of_another_accounts_delivery_takes_nothing_from_it(pool):
    """Only the create path sets replay_of, from a delivery of the same account; should one ever
    name another account's, the statement reads no webhook-id across accounts."""
    owner = await make_account(pool, balance=100)
    await add_endpoint(pool, owner)
    theirs = await _one(pool, MessageRequest(owner, "invoice.paid", b"{}"))
    other = await make_account(pool, balance=100)
    other_endpoint = await add_endpoint(pool, other)
    replay = await _one(pool, MessageRequest(other, "invoice.paid", b"{}", endpoint_ids=(other_endpoint,),
                                             replay_of=theirs))
    assert (await _webhook_ids(pool, [replay]))[replay] is None
