"""A hypothesis state machine drives one account through random operations on a real database.

Each example gets a fresh account (with three endpoints) in one database shared by the whole
run; after every step the database must agree with a small in-memory model of the account
(balance, every delivery's state and attempt, every delivery's ledger rows) and the audit of
the account must be clean. Hypothesis is synchronous, so the async calls run on one dedicated
event loop owned by the test, with its own pool.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field

import asyncpg
import hypothesis.strategies as st
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule, run_state_machine_as_test

from billing import accounts, closeout, ids, messages
from billing.audit import audit
from billing.database import create_pool
from billing.errors import (
    AccountNotActive,
    IdempotencyConflict,
    InsufficientBalance,
    TopupConflict,
    TopupUnknown,
)
from billing.settle import DeadReason, Outcome, settle
from delivery.engine import claims, presend, results
from ledger_helpers import LEASE_MS_LONG

EVENT_TYPES = ("a", "b", "c")
# Endpoint subscriptions of every example's account: all types, only "a", "a" and "b".
SUBSCRIPTIONS = (None, ["a"], ["a", "b"])
STEPS_BEFORE_CLOSING = 15


@dataclass
class ModelDelivery:
    endpoint_index: int
    message_id: uuid.UUID
    endpoint_id: uuid.UUID
    price: int
    attempts_max: int
    state: str = "pending"
    attempt: int = 0
    refunded: bool = False
    reclaimed: bool = False
    reported: dict[int, bool] = field(default_factory=dict)  # attempt -> success, each reported once


def _claimable(model: ModelDelivery) -> bool:
    return model.state == "pending" and model.attempt < model.attempts_max


def _sending(model: ModelDelivery) -> bool:
    return model.state == "sending"


class LedgerMachine(RuleBasedStateMachine):
    loop: asyncio.AbstractEventLoop
    pool: asyncpg.Pool

    def run(self, awaitable):
        return self.loop.run_until_complete(awaitable)

    @initialize(price=st.integers(0, 3), opening_balance=st.integers(0, 40))
    def open_account(self, price, opening_balance):
        self.price = price
        self.account_id = self.run(accounts.create_account(self.pool, "machine", price_per_delivery=price)).id
        self.endpoint_ids = []
        for event_types in SUBSCRIPTIONS:
            endpoint_id = ids.new_id()
            self.run(self.pool.execute(
                "INSERT INTO endpoints (id, account_id, url, event_types, enabled) VALUES ($1, $2, $3, $4, true)",
                endpoint_id, self.account_id, f"https://example.com/{endpoint_id}", event_types))
            self.endpoint_ids.append(endpoint_id)
        self.enabled = [True] * len(SUBSCRIPTIONS)
        self.balance = 0
        self.status = "active"
        self.orders: dict[str, int] = {}
        self.reversed: set[str] = set()
        self.keys: dict[str, tuple[str, bytes, list[uuid.UUID]]] = {}
        self.deliveries: dict[uuid.UUID, ModelDelivery] = {}
        self.order_count = 0
        self.steps = 0
        if opening_balance:
            self.top_up(opening_balance, reuse=1, same_amount=False)

    # --- money in and out -------------------------------------------------------------------

    @rule(amount=st.integers(1, 12), reuse=st.integers(0, 50), same_amount=st.booleans())
    def top_up(self, amount, reuse, same_amount):
        if self.orders and reuse % 3 == 0:
            order = sorted(self.orders)[reuse % len(self.orders)]
            amount = self.orders[order] if same_amount else self.orders[order] + amount
        else:
            self.order_count += 1
            order = f"{self.account_id}-{self.order_count}"
        if order in self.orders:
            expected = None if self.orders[order] == amount else TopupConflict
        elif self.status != "active":
            expected = AccountNotActive
        else:
            expected = None
        outcome = self._call(accounts.top_up(self.pool, self.account_id, order, amount), expected)
        if expected is None:
            assert outcome.applied == (order not in self.orders)
            if outcome.applied:
                self.orders[order] = amount
                self.balance += amount

    @rule(pick=st.integers(0, 50))
    def reverse_top_up(self, pick):
        known = sorted(self.orders)
        order = known[pick % len(known)] if known and pick % 4 else f"{self.account_id}-unknown"
        if order not in self.orders:
            expected = TopupUnknown
        elif order in self.reversed:
            expected = None
        elif self.balance < self.orders[order]:
            expected = InsufficientBalance
        else:
            expected = None
        outcome = self._call(accounts.reverse_top_up(self.pool, self.account_id, order), expected)
        if expected is None:
            assert outcome.applied == (order not in self.reversed)
            if outcome.applied:
                self.reversed.add(order)
                self.balance -= self.orders[order]

    # --- creating messages ------------------------------------------------------------------

    @rule(event_type=st.sampled_from(EVENT_TYPES), key=st.sampled_from([None, "new", "old", "old-other"]),
          attempts_max=st.integers(1, 3))
    def create(self, event_type, key, attempts_max):
        payload = f"{event_type}-{len(self.deliveries)}".encode()
        key_name = None
        if key == "new":
            key_name = f"key-{len(self.keys)}"
        elif key.startswith("old") if key else False:
            if not self.keys:
                return
            key_name = sorted(self.keys)[len(self.deliveries) % len(self.keys)]
            stored_type, stored_payload, _ = self.keys[key_name]
            event_type, payload = (stored_type, stored_payload) if key == "old" else (stored_type, stored_payload + b"!")
        subscribed = [
            index for index, event_types in enumerate(SUBSCRIPTIONS)
            if self.enabled[index] and (event_types is None or event_type in event_types)
        ]
        if key_name in self.keys:
            expected = None if key == "old" else IdempotencyConflict
        elif self.status != "active":
            expected = AccountNotActive
        elif self.balance < self.price * len(subscribed):
            expected = InsufficientBalance
        else:
            expected = None
        request = messages.MessageRequest(self.account_id, event_type, payload, key_name)
        outcome = self._call(messages.create_message(self.pool, request, attempts_max=attempts_max), expected)
        if expected is not None:
            return
        if key_name in self.keys:
            assert outcome.replayed
            assert sorted(d.id for d in outcome.deliveries) == sorted(self.keys[key_name][2])
            return
        assert sorted(d.endpoint_id for d in outcome.deliveries) == sorted(self.endpoint_ids[i] for i in subscribed)
        self._add_deliveries(outcome, attempts_max)
        if key_name is not None:
            self.keys[key_name] = (event_type, payload, [d.id for d in outcome.deliveries])

    @rule(event_types=st.lists(st.sampled_from(EVENT_TYPES), min_size=1, max_size=4), attempts_max=st.integers(1, 3))
    def create_batch(self, event_types, attempts_max):
        """Several requests in one create_messages call: each fits the balance left by those before it, or is refused alone."""
        requests = [
            messages.MessageRequest(self.account_id, event_type, f"batch-{len(self.deliveries)}-{n}".encode())
            for n, event_type in enumerate(event_types)
        ]
        outcomes = self.run(messages.create_messages(self.pool, requests, attempts_max=attempts_max))
        for request, outcome in zip(requests, outcomes):
            subscribed = [
                index for index, types in enumerate(SUBSCRIPTIONS)
                if self.enabled[index] and (types is None or request.event_type in types)
            ]
            if self.status != "active":
                assert isinstance(outcome, AccountNotActive), outcome
            elif self.balance < self.price * len(subscribed):
                assert isinstance(outcome, InsufficientBalance), outcome
            else:
                assert isinstance(outcome, messages.MessageCreated), outcome
                self._add_deliveries(outcome, attempts_max)

    @rule(index=st.integers(0, len(SUBSCRIPTIONS) - 1))
    def toggle_endpoint(self, index):
        self.enabled[index] = not self.enabled[index]
        self.run(self.pool.execute("UPDATE endpoints SET enabled = $2 WHERE id = $1",
                                   self.endpoint_ids[index], self.enabled[index]))

    # --- the delivery lifecycle -------------------------------------------------------------

    def _pick(self, pick: int, *, claimed_only: bool = False, prefer=None) -> tuple[uuid.UUID, ModelDelivery] | None:
        """A delivery by index; among those matching `prefer` when there are any, so few steps are wasted."""
        candidates = sorted(i for i, d in self.deliveries.items() if d.attempt > 0 or not claimed_only)
        preferred = [i for i in candidates if prefer is not None and prefer(self.deliveries[i])]
        candidates = preferred or candidates
        if not candidates:
            return None
        delivery_id = candidates[pick % len(candidates)]
        return delivery_id, self.deliveries[delivery_id]

    # Each rule picks a delivery; the helpers below act on it and update the model.

    @rule(pick=st.integers(0, 1000))
    def claim(self, pick):
        picked = self._pick(pick, prefer=_claimable)
        if picked is not None:
            self._claim(*picked)

    @rule(pick=st.integers(0, 1000), then=st.sampled_from(["success", "failure", "lease lost", "pre-send check"]))
    def send_cycle(self, pick, then):
        """Claim a due delivery and finish the attempt in one step, so lifecycles complete within the step bound."""
        picked = self._pick(pick, prefer=_claimable)
        if picked is None or not self._claim(*picked):
            return
        if then == "pre-send check":
            self._pre_send_check(*picked)
        elif then == "lease lost":
            self._expire_lease(*picked)
        else:
            self._record(*picked, picked[1].attempt, then == "success")

    @rule(pick=st.integers(0, 1000))
    def pre_send_check(self, pick):
        picked = self._pick(pick, claimed_only=True, prefer=_sending)
        if picked is not None and picked[1].state == "sending":
            self._pre_send_check(*picked)

    @rule(pick=st.integers(0, 1000), success=st.booleans(), back=st.integers(0, 2))
    def record_result(self, pick, success, back):
        # back == 0 mostly reports on a delivery being sent; back > 0 mostly sends stale reports.
        picked = self._pick(pick, claimed_only=True, prefer=lambda d: _sending(d) == (back == 0))
        if picked is not None:
            self._record(*picked, max(1, picked[1].attempt - back), success)

    @rule(pick=st.integers(0, 1000), reason=st.sampled_from(list(DeadReason)), quote=st.sampled_from(
        ["none", "current", "old"]))
    def settle_directly(self, pick, reason, quote):
        picked = self._pick(pick)
        if picked is None:
            return
        delivery_id, model = picked
        attempt = {"none": None, "current": model.attempt, "old": model.attempt - 1}[quote]
        outcome = self.run(settle(self.pool, delivery_id, reason, attempt=attempt)).outcome
        if attempt is not None and attempt != model.attempt:
            assert outcome == Outcome.STALE
        elif model.state == "delivered":
            assert outcome == Outcome.DELIVERED
        elif model.state == "dead":
            assert outcome == Outcome.ALREADY_SETTLED
        else:
            assert outcome == Outcome.REFUNDED
            self._die(model)

    @rule(pick=st.integers(0, 1000))
    def expire_lease(self, pick):
        picked = self._pick(pick, claimed_only=True, prefer=_sending)
        if picked is not None and picked[1].state == "sending":
            self._expire_lease(*picked)

    def _claim(self, delivery_id: uuid.UUID, model: ModelDelivery) -> bool:
        taken = self.run(claims.claim_ids(self.pool, [delivery_id], lease_ms=LEASE_MS_LONG))
        if not _claimable(model):
            assert taken == []
            return False
        assert [c.attempt for c in taken] == [model.attempt + 1]
        model.state, model.attempt = "sending", model.attempt + 1
        return True

    def _pre_send_check(self, delivery_id: uuid.UUID, model: ModelDelivery) -> None:
        claimed = claims.Claimed(delivery_id, self.account_id, model.message_id, model.endpoint_id, model.attempt,
                                 model.attempts_max)
        outgoing, settled = self.run(presend.load_for_send(self.pool, [claimed]))
        if self.status != "active" or not self.enabled[model.endpoint_index]:
            assert outgoing == [] and [s.outcome for s in settled] == [Outcome.REFUNDED]
            self._die(model)
        else:
            assert settled == [] and len(outgoing) == 1

    def _record(self, delivery_id: uuid.UUID, model: ModelDelivery, attempt: int, success: bool) -> None:
        success = model.reported.get(attempt, success)  # an attempt has one result; repeats repeat it
        model.reported[attempt] = success
        result = results.AttemptResult(delivery_id, attempt, self.account_id, success, 1,
                                       200 if success else 500, None if success else "HTTP 500")
        summary = self.run(results.record_results(self.pool, [result]))
        if success and model.state == "pending" and model.attempt == attempt:
            # A late success on the attempt the delivery still waits on (its lease expired, no retry
            # claimed yet) delivers it: it did arrive.
            assert summary.delivered == [delivery_id]
            model.state = "delivered"
            return
        if model.state == "sending" and model.attempt == attempt:
            if success:
                assert summary.delivered == [delivery_id]
                model.state = "delivered"
            elif attempt < model.attempts_max:
                assert summary.retrying == [delivery_id]
                model.state = "pending"
            else:
                assert summary.settled == [delivery_id]
                self._die(model)
            return
        assert summary.stale == [delivery_id]
        if success and model.state == "dead" and model.refunded and not model.reclaimed and self.status == "active":
            assert summary.reclaimed == [delivery_id]
            model.state, model.reclaimed = "delivered", True
            self.balance -= model.price
        else:
            assert summary.reclaimed == []

    def _expire_lease(self, delivery_id: uuid.UUID, model: ModelDelivery) -> None:
        self.run(self.pool.execute(
            "UPDATE deliveries SET leased_until = now() - interval '1 second' WHERE id = $1", delivery_id))
        expired = self.run(results.expire_leases(self.pool, batch_size=100, delay_seconds=lambda attempt: 0.0))
        assert expired == [delivery_id]
        model.state = "pending"
        exhausted = self.run(claims.settle_exhausted(self.pool, batch_size=100))
        if model.attempt >= model.attempts_max:
            assert exhausted == 1
            self._die(model)
        else:
            assert exhausted == 0

    # --- closing the account ----------------------------------------------------------------

    # Closing ends most of what an example can do, so it waits until the account has some history.
    @precondition(lambda self: self.steps >= STEPS_BEFORE_CLOSING)
    @rule()
    def begin_closing(self):
        status = self.run(closeout.begin_closing(self.pool, self.account_id))
        self.status = "closing" if self.status == "active" else self.status
        assert status == self.status

    @precondition(lambda self: self.steps >= STEPS_BEFORE_CLOSING and self.status != "deleted")
    @rule()
    def delete_account(self):
        self.run(closeout.begin_closing(self.pool, self.account_id))
        settled = self.run(closeout.bulk_settle(self.pool, self.account_id))
        live = [m for m in self.deliveries.values() if m.state in ("pending", "sending")]
        assert settled.locked == settled.refunded == settled.marked_dead == len(live)
        for model in live:
            self._die(model)
        closed = self.run(closeout.close_out(self.pool, self.account_id))
        assert closed.owed_to_customer == self.balance
        self.balance = 0
        self.status = "deleted"

    # --- the model's bookkeeping ------------------------------------------------------------

    def _add_deliveries(self, created: messages.MessageCreated, attempts_max: int) -> None:
        assert not created.replayed
        for item in created.deliveries:
            self.deliveries[item.id] = ModelDelivery(
                self.endpoint_ids.index(item.endpoint_id), created.message_id, item.endpoint_id, self.price, attempts_max)
        assert created.total_charged == self.price * len(created.deliveries)
        self.balance -= created.total_charged

    def _die(self, model: ModelDelivery) -> None:
        assert model.state in ("pending", "sending") and not model.refunded
        model.state, model.refunded = "dead", True
        self.balance += model.price

    def _call(self, awaitable, expected: type[Exception] | None):
        try:
            outcome = self.run(awaitable)
        except Exception as error:
            assert expected is not None and isinstance(error, expected), (expected, error)
            return None
        assert expected is None, f"expected {expected.__name__}, got {outcome}"
        return outcome

    @invariant()
    def database_matches_the_model(self):
        if not hasattr(self, "account_id"):
            return
        self.steps += 1
        account = self.run(self.pool.fetchrow("SELECT balance, status FROM accounts WHERE id = $1", self.account_id))
        assert (account["balance"], account["status"]) == (self.balance, self.status)
        rows = self.run(self.pool.fetch(
            "SELECT d.id, d.state, d.attempt, array_agg(l.id ORDER BY l.id) AS entries, sum(l.amount) AS net"
            " FROM deliveries d JOIN ledger_entries l ON l.delivery_id = d.id"
            " WHERE d.account_id = $1 GROUP BY d.account_id, d.id", self.account_id))
        assert len(rows) == len(self.deliveries)
        for row in rows:
            model = self.deliveries[row["id"]]
            expected_entries = [ids.charge_id(row["id"])]
            expected_entries += [ids.reclaim_id(row["id"])] if model.reclaimed else []
            expected_entries += [ids.refund_id(row["id"])] if model.refunded else []
            assert (row["state"], row["attempt"], row["entries"]) == (model.state, model.attempt, expected_entries)
        report = self.run(audit(self.pool, self.account_id))
        assert report.clean, report.to_json()


def test_ledger_state_machine(make_database):
    """Random top-ups, reversals, creates, claims, results, settles, lease expiries and deletions keep the
    database equal to the model (balance, states, ledger rows) and the audit clean after every step."""
    loop = asyncio.new_event_loop()
    pool = loop.run_until_complete(create_pool(make_database("hookledger_sm"), size_max=4))
    try:
        LedgerMachine.loop, LedgerMachine.pool = loop, pool
        run_state_machine_as_test(LedgerMachine, settings=settings(
            max_examples=30, stateful_step_count=25, deadline=None, database=None,
            suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
        ))
        # Every example's account, checked together once more at the end.
        report = loop.run_until_complete(audit(pool))
        assert report.clean, report.to_json()
        assert report.accounts >= 1
    finally:
        loop.run_until_complete(pool.close())
        loop.close()
