"""The chaos workload, driven through the API with the SDK while faults are injected.

Accounts (each with several endpoints on the programmed receivers, so every send fans out),
top-ups (some repeated with the same order id, some reversed), sends at a paced rate (some
sent again with the same Idempotency-Key, which must answer the same message and charge
nothing), and chores in the middle of it all: endpoints deleted and disabled, accounts
deleted, dead deliveries replayed, messages expunged (erased now; some asked twice, which must
answer the same). Every account keeps payloads ERASURE_RETENTION_DAYS, the shortest retention,
and has an operational endpoint on the healthy receiver, so the operational events of all this
are sent under the same faults.

API processes get restarted under the workload, so every call goes through `_failover`: the
SDK retries one API process (with the same idempotency key), and when that process stays
unreachable the call moves to another one, still with the same key.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime

import httpx

from delivery.chaos.receivers import BEHAVIOURS, ReceiverFarm
from delivery.client import AsyncClient
from delivery.client.errors import (
    APIConnectionError,
    ConflictError,
    HookledgerError,
    RateLimitError,
    ServerError,
)
from delivery.client.retry import RetryPolicy
from signing import generate_secret

BEHAVIOUR_WEIGHTS = {"healthy": 35, "flaky": 25, "slow": 8, "reset": 10, "gone": 7, "down": 15}
FAILOVER_ROUNDS_MAX = 12  # calls to other API processes after the SDK's own retries gave up
RESEND_SHARE = 0.1  # of sends sent a second time with the same Idempotency-Key
ENDPOINT_DELETE_SHARE = 0.05
ENDPOINT_DISABLE_SHARE = 0.05
ACCOUNT_DELETE_SHARE = 0.1
EXTRA_TOPUP_SHARE = 0.2
REVERSAL_SHARE = 0.05
REPLAY_TICKS = 12  # replay rounds over the window
REPLAYS_PER_TICK = 3
SETUP_CONCURRENCY = 8
BUDGET_MARGIN = 3  # top-ups cover this many times the account's expected charges
HARD_STOP_FACTOR = 2.0  # sending stops at this many windows even if the target was not reached
EXPUNGE_TICKS = 15  # expunge rounds over the window
EXPUNGES_PER_TICK = 4
EXPUNGE_CHOSEN_FROM_LAST = 200  # messages sent most recently: older ones are mostly erased by retention already
EXPUNGE_TWICE_SHARE = 0.3  # of expunges asked again, which must answer the same erasure
SENT_MESSAGES_KEPT_MAX = 200_000  # the messages expunges choose from (the long run sends about 25,000)
ERASURE_RETENTION_DAYS = 1  # every account's payload_retention_days (delivery.chaos.erasure ages messages past it)
SDK_POLICY = RetryPolicy(retries=3, backoff_base_seconds=0.2, backoff_max_seconds=1.0, retry_after_max_seconds=5.0)
FAILOVER_ERRORS = (APIConnectionError, ServerError, RateLimitError)


@dataclass(frozen=True)
class Sizes:
    accounts: int
    endpoints_min: int
    endpoints_max: int
    deliveries: int
    window_seconds: float
    concurrency: int
    fault_cycles: int


@dataclass
class AccountState:
    number: int
    id: str
    price: int
    clients: list[AsyncClient]
    endpoints: list[str] = field(default_factory=list)
    active: bool = True
    turn: int = 0


@dataclass
class Workload:
    api_urls: list[str]
    operator_key: str
    receivers: ReceiverFarm
    sizes: Sizes
    rng: random.Random
    tally: Counter = field(default_factory=Counter)
    refused: Counter = field(default_factory=Counter)  # problem slug -> calls
    accounts: list[AccountState] = field(default_factory=list)
    orders: dict[str, int] = field(default_factory=dict)  # order id -> amount, every top-up asked for
    orders_answered: set[str] = field(default_factory=set)
    reversed_orders: set[str] = field(default_factory=set)
    accepted_deliveries: set[str] = field(default_factory=set)  # ids the API answered 202 with
    deleted_accounts: list[str] = field(default_factory=list)
    mismatches: list[str] = field(default_factory=list)  # idempotency answers that disagree
    sent_messages: list[tuple[AccountState, str]] = field(default_factory=list)  # (account, message id), in order
    # message id -> (its account id, payload_erased_at the API answered)
    expunged: dict[str, tuple[str, datetime]] = field(default_factory=dict)
    _operators: list[AsyncClient] = field(default_factory=list)
    _http: list[httpx.AsyncClient] = field(default_factory=list)
    _created: int = 0

    # ---- clients and failover ---------------------------------------------------------------------

    def _clients(self, key: str) -> list[AsyncClient]:
        return [AsyncClient(url, key, timeout=5.0, retry_policy=SDK_POLICY) for url in self.api_urls]

    async def _failover(self, clients: list[AsyncClient], turn: int, make_call):
        last: Exception | None = None
        for round_number in range(FAILOVER_ROUNDS_MAX):
            client = clients[(turn + round_number) % len(clients)]
            try:
                return await make_call(client)
            except FAILOVER_ERRORS as error:
                last = error
                self.tally["failovers"] += 1
                await asyncio.sleep(min(2.0, 0.1 * 2 ** round_number))
        assert last is not None
        raise last

    async def _operator(self, make_call):
        self.tally["operator_calls"] += 1
        return await self._failover(self._operators, self.rng.randrange(len(self._operators)), make_call)

    async def _as(self, account: AccountState, make_call):
        account.turn += 1
        return await self._failover(account.clients, account.turn, make_call)

    async def close(self) -> None:
        for client in self._operators + [c for a in self.accounts for c in a.clients]:
            await client.aclose()
        for http in self._http:
            await http.aclose()

    # ---- setup --------------------------------------------------------------------------------------

    def _budget(self, price: int) -> int:
        per_account = self.sizes.deliveries / self.sizes.accounts
        return int(per_account * price * BUDGET_MARGIN) + 100

    async def setup(self) -> None:
        self._operators = self._clients(self.operator_key)
        self._http = [httpx.AsyncClient(base_url=url, timeout=5.0,
                                        headers={"Authorization": f"Bearer {self.operator_key}"})
                      for url in self.api_urls]
        plans = [(number, self.rng.randint(1, 3),
                  self.rng.randint(self.sizes.endpoints_min, self.sizes.endpoints_max)) for number in range(self.sizes.accounts)]
        behaviours = list(BEHAVIOUR_WEIGHTS)
        weights = [BEHAVIOUR_WEIGHTS[name] for name in behaviours]
        choices = [[self.rng.choices(behaviours, weights)[0] for _ in range(count)] for _, _, count in plans]
        gate = asyncio.Semaphore(SETUP_CONCURRENCY)

        async def one(plan, endpoint_behaviours):
            async with gate:
                await self._set_up_account(*plan[:2], endpoint_behaviours)

        await asyncio.gather(*(one(plan, chosen) for plan, chosen in zip(plans, choices)))
        self.accounts.sort(key=lambda account: account.number)

    async def _set_up_account(self, number: int, price: int, behaviours: list[str]) -> None:
        created = await self._operator(lambda c: c.accounts.create(
            f"chaos {number}", price_per_delivery=price, payload_retention_days=ERASURE_RETENTION_DAYS))
        account = AccountState(number, str(created.account.id), price, self._clients(created.api_key.key))
        self.accounts.append(account)
        await self._operational_endpoint(account)  # first: the top-up's event goes to it too
        await self._top_up(account, f"chaos-{account.id}-0", self._budget(price), repeat=True)
        for behaviour in behaviours:
            assert behaviour in BEHAVIOURS
            key, secret = uuid.uuid4().hex, generate_secret()
            url = self.receivers.url(behaviour, key, secret)
            endpoint = await self._as(account, lambda c, url=url, secret=secret, behaviour=behaviour: c.endpoints.create(
                url, secret=secret, description=behaviour))
            account.endpoints.append(str(endpoint.id))
        self.tally["endpoints"] += len(account.endpoints)

    async def _operational_endpoint(self, account: AccountState) -> None:
        """Where the account's operational events go: the healthy receiver, under its own secret. One
        Idempotency-Key for every API process the create fails over to: one endpoint, however retried."""
        key, secret, idempotency_key = uuid.uuid4().hex, generate_secret(), str(uuid.uuid4())
        url = self.receivers.url("healthy", key, secret, operational=True)
        await self._as(account, lambda c: c.operational.create_endpoint(url, secret=secret, description="chaos",
                                                                        idempotency_key=idempotency_key))
        # balance.low when half the budget is spent (some accounts get there within the window).
        await self._as(account, lambda c: c.operational.set_low_balance_threshold(self._budget(account.price) // 2))
        self.tally["operational_endpoints"] += 1

    async def _top_up(self, account: AccountState, order_id: str, amount: int, *, repeat: bool) -> None:
        self.orders[order_id] = amount
        await self._operator(lambda c: c.accounts.top_up(account.id, order_id, amount))
        self.orders_answered.add(order_id)
        self.tally["topups"] += 1
        if repeat:
            again = await self._operator(lambda c: c.accounts.top_up(account.id, order_id, amount))
            self.tally["topup_repeats"] += 1
            if again.applied:
                self.mismatches.append(f"top-up {order_id} applied twice")

    # ---- the paced sends ----------------------------------------------------------------------------

    async def drive(self) -> None:
        """Send until the target number of deliveries exists, paced over the window, with the chores."""
        started = time.monotonic()
        chores = asyncio.create_task(self._chores(started))
        senders = [asyncio.create_task(self._sender(started)) for _ in range(self.sizes.concurrency)]
        try:
            await asyncio.gather(*senders)
        finally:
            await chores

    async def _sender(self, started: float) -> None:
        window = self.sizes.window_seconds
        while self._created < self.sizes.deliveries:
            elapsed = time.monotonic() - started
            if elapsed > window * HARD_STOP_FACTOR:
                self.tally["sends_stopped_at_hard_stop"] += 1
                return
            due = self._created / self.sizes.deliveries * window
            if due > elapsed:
                await asyncio.sleep(min(due - elapsed, 0.5))
                continue
            active = [account for account in self.accounts if account.active]
            if not active:
                return
            await self._send(self.rng.choice(active))

    async def _send(self, account: AccountState) -> None:
        key = uuid.uuid4().hex
        payload = {"n": self.tally["sends"], "account": account.number, "text": "chaos " * 8}
        self.tally["sends"] += 1
        try:
            message = await self._as(account, lambda c: c.send("chaos.event", payload, idempotency_key=key))
        except HookledgerError as error:
            self._refused(account, error)
            return
        self.tally["messages"] += 1
        if len(self.sent_messages) < SENT_MESSAGES_KEPT_MAX:
            self.sent_messages.append((account, str(message.id)))
        self.tally["replayed_on_retry"] += message.replayed
        self._created += len(message.deliveries)
        self.accepted_deliveries.update(str(d.id) for d in message.deliveries)
        if self.rng.random() < RESEND_SHARE:
            await self._resend(account, key, payload, message)

    async def _resend(self, account: AccountState, key: str, payload: dict, first) -> None:
        """The same Idempotency-Key and body again: the same message, nothing charged anew."""
        self.tally["idempotent_resends"] += 1
        try:
            again = await self._as(account, lambda c: c.send("chaos.event", payload, idempotency_key=key))
        except HookledgerError as error:
            self._refused(account, error)
            return
        if again.id != first.id or not again.replayed or again.total_charged != first.total_charged:
            self.mismatches.append(f"resend of key {key}: {first.id} -> {again.id}, replayed={again.replayed}")

    def _refused(self, account: AccountState, error: HookledgerError) -> None:
        self.refused[error.slug if error.status else type(error).__name__] += 1
        if error.status in (401, 403) or not account.active:
            account.active = False

    # ---- chores in the middle of the run ------------------------------------------------------------

    def _chore_plan(self) -> list[tuple[float, str, object]]:
        window = self.sizes.window_seconds
        plan: list[tuple[float, str, object]] = []

        def at(low: float, high: float) -> float:
            return self.rng.uniform(low * window, high * window)

        endpoints = [(account, endpoint) for account in self.accounts for endpoint in account.endpoints]
        for account, endpoint in self.rng.sample(endpoints, int(len(endpoints) * ENDPOINT_DELETE_SHARE)):
            plan.append((at(0.1, 0.9), "delete_endpoint", (account, endpoint)))
        for account, endpoint in self.rng.sample(endpoints, int(len(endpoints) * ENDPOINT_DISABLE_SHARE)):
            plan.append((at(0.1, 0.9), "disable_endpoint", (account, endpoint)))
        doomed = self.rng.sample(self.accounts, max(2, int(len(self.accounts) * ACCOUNT_DELETE_SHARE)))
        for account in doomed:
            plan.append((at(0.2, 0.8), "delete_account", account))
        for account in self.rng.sample(self.accounts, int(len(self.accounts) * EXTRA_TOPUP_SHARE)):
            plan.append((at(0.1, 0.9), "extra_topup", account))
        for account in self.rng.sample(self.accounts, max(1, int(len(self.accounts) * REVERSAL_SHARE))):
            plan.append((at(0.1, 0.9), "reversal", account))
        for tick in range(REPLAY_TICKS):
            plan.append(((tick + 1) / (REPLAY_TICKS + 1) * window, "replay", None))
        for tick in range(EXPUNGE_TICKS):
            plan.append(((tick + 1) / (EXPUNGE_TICKS + 1) * window, "expunge", None))
        plan.sort(key=lambda item: item[0])
        return plan

    async def _chores(self, started: float) -> None:
        for at_seconds, name, argument in self._chore_plan():
            delay = started + at_seconds - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            try:
                await getattr(self, "_chore_" + name)(argument)
                self.tally[name] += 1
            except HookledgerError as error:
                self.tally[f"{name}_refused"] += 1
                self.refused[f"{name}:{error.slug if error.status else type(error).__name__}"] += 1

    async def _chore_delete_endpoint(self, argument) -> None:
        account, endpoint = argument
        if account.active:
            await self._as(account, lambda c: c.endpoints.delete(endpoint))

    async def _chore_disable_endpoint(self, argument) -> None:
        account, endpoint = argument
        if account.active:
            await self._as(account, lambda c: c.endpoints.update(endpoint, enabled=False))

    async def _chore_delete_account(self, account: AccountState) -> None:
        account.active = False
        await self.request_deletion(account.id)
        self.deleted_accounts.append(account.id)

    async def request_deletion(self, account_id: str) -> None:
        async def call(client: AsyncClient):  # the SDK has no call for it: the operator's DELETE by hand
            http = self._http[self._operators.index(client)]
            try:
                response = await http.delete(f"/v1/accounts/{account_id}")
            except httpx.TransportError as error:
                raise APIConnectionError(str(error) or type(error).__name__) from error
            if response.status_code >= 500:
                raise ServerError(f"{response.status_code}", status=response.status_code)
            if response.status_code != 202:
                raise HookledgerError(response.text, status=response.status_code)

        await self._operator(call)

    async def deletion_status(self, account_id: str) -> str:
        async def call(client: AsyncClient):
            http = self._http[self._operators.index(client)]
            try:
                response = await http.get(f"/v1/accounts/{account_id}/deletion")
            except httpx.TransportError as error:
                raise APIConnectionError(str(error) or type(error).__name__) from error
            if response.status_code >= 500:
                raise ServerError(f"{response.status_code}", status=response.status_code)
            return response.json()["status"]

        return await self._operator(call)

    async def _chore_extra_topup(self, account: AccountState) -> None:
        if account.active:
            await self._top_up(account, f"chaos-{account.id}-extra", self._budget(account.price) // 2, repeat=True)

    async def _chore_reversal(self, account: AccountState) -> None:
        """A top-up and its reversal (the order was refunded to the customer's card, say)."""
        if not account.active:
            return
        order_id = f"chaos-{account.id}-reversed"
        await self._top_up(account, order_id, 50, repeat=False)
        await self._operator(lambda c: c.accounts.reverse_top_up(account.id, order_id))
        self.reversed_orders.add(order_id)

    async def _chore_replay(self, _argument) -> None:
        """Replay a few dead deliveries: each replay is a new delivery, charged anew."""
        for account in self.rng.sample(self.accounts, min(len(self.accounts), REPLAYS_PER_TICK * 3)):
            if not account.active:
                continue
            page = await self._as(account, lambda c: c.deliveries.list(state="dead", limit=20))
            # Those that died of their own failures: a deleted or disabled endpoint cannot take a replay.
            replayable = [d for d in page.data if d.dead_reason in ("out_of_retries", "attempts_exhausted")]
            if not replayable:
                continue
            dead = self.rng.choice(replayable)
            try:
                message = await self._as(account, lambda c, dead=dead: c.deliveries.replay(dead.id))
            except HookledgerError as error:
                self.refused[f"replay:{error.slug if error.status else type(error).__name__}"] += 1
                continue
            self.tally["replays_done"] += 1
            self.accepted_deliveries.update(str(d.id) for d in message.deliveries)
            self._created += len(message.deliveries)
            if self.tally["replays_done"] % REPLAYS_PER_TICK == 0:
                return

    async def _chore_expunge(self, _argument) -> None:
        """Expunge a few of the messages sent last: 200 erases (or answers retention's erasure), 409 while a
        delivery is live; some asked twice, which must answer the same erasure."""
        recent = self.sent_messages[-EXPUNGE_CHOSEN_FROM_LAST:]
        for account, message_id in self.rng.sample(recent, min(len(recent), EXPUNGES_PER_TICK)):
            if not account.active:
                continue
            try:
                erased = await self._as(account, lambda c, m=message_id: c.messages.expunge(m))
            except ConflictError as error:
                self.tally["expunge_live" if error.slug == "message-live" else "expunge_conflict"] += 1
                continue
            except HookledgerError as error:
                self.refused[f"expunge:{error.slug if error.status else type(error).__name__}"] += 1
                if error.status == 404 and account.active:
                    self.mismatches.append(f"expunge of {message_id}, a message of an active account: 404")
                continue
            self.tally["expunged"] += 1
            self.expunged[message_id] = (account.id, erased.payload_erased_at)
            if self.rng.random() < EXPUNGE_TWICE_SHARE:
                again = await self._as(account, lambda c, m=message_id: c.messages.expunge(m))
                self.tally["expunged_twice"] += 1
                if again != erased:
                    self.mismatches.append(f"expunge of {message_id} twice: {erased} then {again}")
