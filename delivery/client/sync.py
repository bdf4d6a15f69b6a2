"""The blocking client: `Client(base_url, api_key)`; see the package docstring for the tour."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any

import httpx

from delivery.client import calls, models, transport
from delivery.client.operational import Operational
from delivery.client.calls import UNSET, Call, Id
from delivery.client.retry import RetryPolicy


class Client:
    """A hookledger API client. Thread-safe; reuse one per process and close it (or use `with`).

    `timeout`: seconds for each attempt (connect, read, write, pool). `retries`: how many times
    one call may be retried (see retry.py for which failures are). `sleep` is how the client waits
    between attempts; tests pass a fake. `http_client` replaces the httpx.Client built here (its
    base URL, headers and timeout are then the caller's).
    """

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout: float = transport.TIMEOUT_SECONDS_DEFAULT,
        retries: int = 2,
        retry_policy: RetryPolicy | None = None,
        sleep: Callable[[float], None] = time.sleep,
        http_client: httpx.Client | None = None,
    ) -> None:
        self._policy = retry_policy or RetryPolicy(retries=retries)
        self._sleep = sleep
        self._http = http_client or httpx.Client(
            base_url=transport.checked_base_url(base_url), headers=transport.default_headers(api_key),
            timeout=timeout, follow_redirects=False,
        )
        self.endpoints = Endpoints(self)
        self.applications = Applications(self)
        self.event_types = EventTypes(self)
        self.deliveries = Deliveries(self)
        self.accounts = Accounts(self)
        self.api_keys = ApiKeys(self)
        self.messages = Messages(self)
        self.operational = Operational(self)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _run(self, call: Call[calls.R]) -> calls.R:
        retry_number, waited = 1, 0.0
        while True:  # bounded: the policy refuses a delay past `retries` (or its in-doubt wait), then the judge raises
            try:
                response = self._http.request(**transport.request_arguments(call))
            except httpx.TransportError as error:
                delay = transport.judge_transport_error(call, error, self._policy, retry_number)
            else:
                done, value = transport.judge_response(call, response, self._policy, retry_number, waited)
                if done:
                    return value
                delay = value
            self._sleep(delay)
            retry_number, waited = retry_number + 1, waited + delay

    def send(self, event_type: str, payload: Any, *, idempotency_key: str | None = None,
             channels: Sequence[str] | None = None) -> models.Message:
        """Send an event to every subscribed endpoint; each delivery is charged. Answers 202 at once.

        Without `idempotency_key` one is generated for this call and reused on its retries, so a
        retried send never charges twice. `payload` is any JSON value; pass `msgspec.Raw(b'...')`
        to send exact bytes.
        """
        return self._run(calls.send(event_type, payload, calls.key_or_new(idempotency_key), channels))

    def account(self) -> models.Account:
        """The calling account: status, balance, price per delivery and payload_retention_days."""
        return self._run(calls.own_account())

    def update_account(self, *, payload_retention_days: int = UNSET,
                       portal_frame_ancestors: Sequence[str] | None = UNSET) -> models.Account:
        """Set what is given: how many days (1 to 3,650) a finished message's payload and its attempts'
        response excerpts are kept before the retention job erases them (the ledger is kept forever),
        and the https origins (at most 10) allowed to embed the customer portal in an iframe (None: none)."""
        frames = portal_frame_ancestors
        if frames is not None and frames is not UNSET:
            frames = list(frames)
        return self._run(calls.update_own_account(payload_retention_days=payload_retention_days,
                                                  portal_frame_ancestors=frames))

    def balance(self) -> models.Balance:
        return self._run(calls.balance())

    def ledger(self, *, limit: int | None = None, cursor: str | None = None,
               delivery_id: Id | None = None) -> models.Page[models.LedgerEntry]:
        """One page of the ledger, oldest first."""
        return self._run(calls.ledger(limit, cursor, delivery_id))


class _Resource:
    def __init__(self, client: Client) -> None:
        self._run = client._run


class Endpoints(_Resource):
    def create(self, url: str, *, description: str = "", event_types: Sequence[str] | None = None,
               timeout_ms: int | None = None, enabled: bool = True, secret: str | None = None,
               idempotency_key: str | None = None, signing_key_type: str | None = None,
               headers: Mapping[str, str] | None = None, rate_limit_per_second: int | None = None) -> models.Endpoint:
        """A new endpoint; `event_types` None subscribes to every event type; `secret` None: generated.
        `signing_key_type` "ed25519" signs with a generated Ed25519 key (receivers verify with its whpk_
        public key, get_secret); `headers` are sent with every request, outside the signature;
        `rate_limit_per_second` caps what all workers together send to it (None: no limit).

        Keyed (one is generated unless given) and retried with that key, so a retry never makes a
        second endpoint, which would receive, and be charged for, every later message again.
        """
        return self._run(calls.create_endpoint(url, description=description, event_types=event_types,
                                               timeout_ms=timeout_ms, enabled=enabled, secret=secret,
                                               idempotency_key=calls.key_or_new(idempotency_key),
                                               signing_key_type=signing_key_type, headers=headers,
                                               rate_limit_per_second=rate_limit_per_second))

    def list(self) -> tuple[models.Endpoint, ...]:
        return self._run(calls.list_endpoints())

    def get(self, endpoint_id: Id) -> models.Endpoint:
        return self._run(calls.get_endpoint(endpoint_id))

    def update(self, endpoint_id: Id, *, url: str = UNSET, description: str = UNSET,
               event_types: Sequence[str] | None = UNSET, enabled: bool = UNSET, timeout_ms: int = UNSET,
               headers: Mapping[str, str] | None = UNSET,
               rate_limit_per_second: int | None = UNSET) -> models.Endpoint:
        """Change only the fields given; `event_types=None` subscribes to every event type; `headers`
        None or {} and `rate_limit_per_second=None` clear them."""
        changes = dict(url=url, description=description, event_types=event_types, enabled=enabled, timeout_ms=timeout_ms,
                       headers=headers, rate_limit_per_second=rate_limit_per_second)
        return self._run(calls.update_endpoint(endpoint_id, changes))

    def delete(self, endpoint_id: Id) -> models.EndpointDeleted:
        return self._run(calls.delete_endpoint(endpoint_id))

    def disable_as_operator(self, endpoint_id: Id) -> models.Endpoint:
        """Switch any account's endpoint off, disabled_reason 'operator' (the client must hold the
        operator key); one already off is answered as it is."""
        return self._run(calls.disable_endpoint_as_operator(endpoint_id))

    def rotate_secret(self, endpoint_id: Id, *, secret: str | None = None, idempotency_key: str | None = None,
                      signing_key_type: str | None = None) -> str:
        """The new secret (generated by the API unless given; `signing_key_type` "ed25519" or "hmac" changes
        its kind, and an Ed25519 key's answer is its whpk_ public key); the old one keeps signing for an overlap.

        Keyed and retried with its key: a retry answers the first rotation's secret, not a second rotation.
        """
        return self._run(calls.rotate_secret(endpoint_id, secret, calls.key_or_new(idempotency_key),
                                             signing_key_type))

    def get_secret(self, endpoint_id: Id) -> str:
        return self._run(calls.get_secret(endpoint_id))

    def recover_plan(self, endpoint_id: Id, since: datetime | str,
                     until: datetime | str | None = None) -> models.RecoverPlan:
        """What `recover` would replay now: the endpoint's dead deliveries that died in [since, until)
        (until None: now) and were not replayed yet, at most 200, and the total it would charge.
        Times need a timezone."""
        return self._run(calls.recover_plan(endpoint_id, since, until))

    def recover(self, endpoint_id: Id, since: datetime | str, until: datetime | str | None = None, *,
                confirm_total: int, idempotency_key: str | None = None) -> models.Recovered:
        """Replay those dead deliveries as new deliveries, each charged anew, if `confirm_total` is
        still the total (else ConflictError, slug total-changed; PaymentRequiredError when the balance
        cannot cover it all: nothing is replayed). `more` True: plan and recover again for the rest.

        Keyed (one is generated unless given) and retried with that key, so a retry answers the first
        call's replays; a dead delivery is replayed at most once whatever happens.
        """
        return self._run(calls.recover(endpoint_id, since, until, confirm_total, calls.key_or_new(idempotency_key)))


class Deliveries(_Resource):
    def list(self, *, limit: int | None = None, cursor: str | None = None, state: str | None = None,
             endpoint_id: Id | None = None, message_id: Id | None = None, created_after: datetime | None = None,
             created_before: datetime | None = None) -> models.Page[models.Delivery]:
        """One page of deliveries, newest first."""
        return self._run(calls.list_deliveries(
            limit=limit, cursor=cursor, state=state, endpoint_id=endpoint_id, message_id=message_id,
            created_after=created_after, created_before=created_before))

    def iterate(self, *, page_size: int | None = None, **filters: Any) -> Iterator[models.Delivery]:
        """Every delivery matching `filters` (as `list` takes them), page after page."""
        cursor = None
        while True:  # ends: each cursor is an older id than the last, and the last page has none
            page = self.list(limit=page_size, cursor=cursor, **filters)
            yield from page.data
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    def get(self, delivery_id: Id) -> models.DeliveryDetail:
        return self._run(calls.get_delivery(delivery_id))

    def replay(self, delivery_id: Id, *, idempotency_key: str | None = None) -> models.Message:
        """Send a dead or delivered delivery again: a new delivery, charged anew.

        Without `idempotency_key` one is generated for this call and reused on its retries, so a
        retried replay never charges twice.
        """
        return self._run(calls.replay_delivery(delivery_id, calls.key_or_new(idempotency_key)))

    def list_dead(self, *, limit: int | None = None, cursor: str | None = None) -> models.Page[models.Delivery]:
        """Operator: dead deliveries across every account, newest first."""
        return self._run(calls.dead_deliveries(limit, cursor))

    def list_dead_letters(self, *, limit: int | None = None, cursor: str | None = None, account_id: Id | None = None,
                          endpoint_id: Id | None = None, dead_reason: str | None = None,
                          died_after: datetime | None = None,
                          died_before: datetime | None = None) -> models.Page[models.DeadDelivery]:
        """Operator: dead deliveries across accounts, newest first, filtered by account, endpoint,
        dead reason and when they died ([died_after, died_before)), each with its endpoint's URL."""
        return self._run(calls.dead_letters(limit=limit, cursor=cursor, account_id=account_id, endpoint_id=endpoint_id,
                                          dead_reason=dead_reason, died_after=died_after, died_before=died_before))

    def inspect(self, delivery_id: Id) -> models.InspectedDelivery:
        """Operator: any account's delivery with its endpoint, latest attempts and ledger entries."""
        return self._run(calls.inspect_delivery(delivery_id))


class Accounts(_Resource):
    """Operator routes: the client must hold the operator key."""

    def create(self, name: str, *, price_per_delivery: int | None = None,
               payload_retention_days: int | None = None,
               idempotency_key: str | None = None) -> models.AccountCreated:
        """An account and its first API key (`.api_key.key`, shown once); keyed and retried with its key.
        `payload_retention_days` None: the platform's default (30)."""
        return self._run(calls.create_account(name, price_per_delivery, calls.key_or_new(idempotency_key),
                                            payload_retention_days))

    def update(self, account_id: Id, *, payload_retention_days: int) -> models.Account:
        """Set the account's payload_retention_days (1 to 3,650)."""
        return self._run(calls.update_account(account_id, payload_retention_days))

    def get(self, account_id: Id) -> models.Account:
        return self._run(calls.get_account(account_id))

    def top_up(self, account_id: Id, order_id: str, amount: int) -> models.Topup:
        """Add `amount` credits once per `order_id`; the same order again answers applied=False."""
        return self._run(calls.top_up(account_id, order_id, amount))

    def reverse_top_up(self, account_id: Id, order_id: str) -> models.Topup:
        return self._run(calls.reverse_top_up(account_id, order_id))

    def delete(self, account_id: Id) -> models.AccountDeletion:
        """Start deleting the account (irreversible): it closes, its live deliveries are refunded once
        and its balance closed out, by a worker; read the job with `deletion`. Again: the same job."""
        return self._run(calls.delete_account(account_id))

    def deletion(self, account_id: Id) -> models.AccountDeletion:
        """The account's deletion job: status running, waiting_repair, done or failed, its step and report."""
        return self._run(calls.account_deletion(account_id))

    def create_api_key(self, account_id: Id, *, idempotency_key: str | None = None) -> models.NewApiKey:
        """A new API key for the account (`.key`, shown once): say after it revoked its last. Keyed and retried."""
        return self._run(calls.create_api_key_for(account_id, calls.key_or_new(idempotency_key)))


class ApiKeys(_Resource):
    def create(self, *, idempotency_key: str | None = None) -> models.NewApiKey:
        """A new API key (`.key`, shown once); keyed and retried with its key, so a retry makes no second key."""
        return self._run(calls.create_api_key(calls.key_or_new(idempotency_key)))

    def list(self) -> tuple[models.ApiKey, ...]:
        return self._run(calls.list_api_keys())

    def revoke(self, key_id: Id) -> None:
        self._run(calls.revoke_api_key(key_id))


class Messages(_Resource):
    def expunge(self, message_id: Id) -> models.MessageErased:
        """Erase the message's payload and its attempts' response excerpts now (the rows and the ledger
        stay). ConflictError (slug message-live, `retry_after_seconds`) while a delivery of it is
        pending or sending; NotFoundError for another account's message. Again: the same answer."""
        return self._run(calls.expunge_message(message_id))


class Applications(_Resource):
    """An account's applications; `application` is an application's id or its uid."""

    def create(self, name: str, *, uid: str | None = None, metadata: dict[str, str] | None = None,
               rate_limit_per_second: int | None = None, idempotency_key: str | None = None) -> models.Application:
        """A new application; a retry of this call (same key) answers the first create's."""
        return self._run(calls.create_application(name, uid=uid, metadata=metadata,
                                                   rate_limit_per_second=rate_limit_per_second,
                                                   idempotency_key=calls.key_or_new(idempotency_key)))

    def list(self, *, limit: int | None = None, cursor: str | None = None) -> models.Page[models.Application]:
        """One page, oldest first (the default application first of all)."""
        return self._run(calls.list_applications(limit, cursor))

    def iterate(self, *, page_size: int | None = None) -> Iterator[models.Application]:
        """Every application, page by page."""
        cursor = None
        while True:
            page = self.list(limit=page_size, cursor=cursor)
            for application in page.data:
                yield application
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    def get(self, application: Id) -> models.Application:
        return self._run(calls.get_application(application))

    def update(self, application: Id, *, name: str = UNSET, uid: str | None = UNSET,
               metadata: dict[str, str] = UNSET, rate_limit_per_second: int | None = UNSET) -> models.Application:
        changes = {"name": name, "uid": uid, "metadata": metadata, "rate_limit_per_second": rate_limit_per_second}
        return self._run(calls.update_application(application, changes))

    def delete(self, application: Id) -> models.ApplicationDeleted:
        """Deletes it and its endpoints (their pending deliveries are refunded); not the default one."""
        return self._run(calls.delete_application(application))

    def send(self, application: Id, event_type: str, payload: Any, *,
             idempotency_key: str | None = None, channels: Sequence[str] | None = None) -> models.Message:
        """Send an event to the application's subscribed endpoints only; each delivery is charged to the account."""
        return self._run(calls.send_to_application(application, event_type, payload,
                                                    calls.key_or_new(idempotency_key), channels))

    def create_endpoint(self, application: Id, url: str, *, description: str = "",
                        event_types: Sequence[str] | None = None, timeout_ms: int | None = None, enabled: bool = True,
                        secret: str | None = None, idempotency_key: str | None = None) -> models.Endpoint:
        return self._run(calls.create_application_endpoint(
            application, url, description=description, event_types=event_types, timeout_ms=timeout_ms,
            enabled=enabled, secret=secret, idempotency_key=calls.key_or_new(idempotency_key)))

    def list_endpoints(self, application: Id) -> tuple[models.Endpoint, ...]:
        return self._run(calls.list_application_endpoints(application))

    def portal_link(self, application: Id) -> models.PortalLink:
        """A single-use link into the application's portal, for its customer (signs in within 15 minutes)."""
        return self._run(calls.create_portal_link(application))

    def usage(self, application: Id, *, since: datetime | str | None = None,
              until: datetime | str | None = None) -> models.ApplicationUsage:
        """Its charges, refunds and reclaims in [since, until), from the account's ledger."""
        return self._run(calls.application_usage(application, since, until))


class EventTypes(_Resource):
    """The account's event catalog, by name."""

    def create(self, name: str, *, description: str = "", schema: dict[str, Any] | bool | None = None,
               archived: bool = False) -> models.EventType:
        """A new event type; with `schema` (a JSON Schema, draft 2020-12) every payload of it must pass."""
        return self._run(calls.create_event_type(name, description=description, schema=schema, archived=archived))

    def list(self, *, limit: int | None = None, cursor: str | None = None,
             include_archived: bool = False) -> models.Page[models.EventType]:
        return self._run(calls.list_event_types(limit, cursor, include_archived))

    def get(self, name: str) -> models.EventType:
        return self._run(calls.get_event_type(name))

    def update(self, name: str, *, description: str = UNSET, schema: dict[str, Any] | bool | None = UNSET,
               archived: bool = UNSET) -> models.EventType:
        """Change its description, its schema (None: none) or archive it."""
        return self._run(calls.update_event_type(name, {"description": description, "schema": schema,
                                                          "archived": archived}))
