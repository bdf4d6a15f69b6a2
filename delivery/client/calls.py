"""Every route the SDK calls, in one place: each builder says the method, the path, whether a
repeat is harmless (see retry.py), the body, and how to read the answer.

The sync and async clients share these builders and differ only in how they send and sleep.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, TypeVar
from urllib.parse import quote

import httpx
import msgspec

from delivery.client import models

R = TypeVar("R")
Id = uuid.UUID | str

IDEMPOTENCY_KEY_HEADER = "Idempotency-Key"
REPLAYED_HEADER = "Idempotent-Replayed"


class _Unset:
    """A keyword argument not given (distinct from None, which PATCH sends as null)."""

    _instance: _Unset | None = None

    def __new__(cls) -> _Unset:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNSET"

    def __bool__(self) -> bool:
        return False


UNSET: Any = _Unset()


@dataclass(frozen=True)
class Call(Generic[R]):
    method: str
    path: str
    idempotent: bool
    read: Callable[[httpx.Response], R]
    params: Mapping[str, str] | None = None
    body: bytes | None = None
    headers: Mapping[str, str] = field(default_factory=dict)

    @property
    def idempotency_key(self) -> str | None:
        return self.headers.get(IDEMPOTENCY_KEY_HEADER)


_ENCODER = msgspec.json.Encoder()
_decoders: dict[Any, msgspec.json.Decoder] = {}


def _decoder(kind: Any) -> msgspec.json.Decoder:
    decoder = _decoders.get(kind)
    if decoder is None:
        decoder = _decoders[kind] = msgspec.json.Decoder(kind)
    return decoder


def _reads(kind: Any) -> Callable[[httpx.Response], Any]:
    def read(response: httpx.Response) -> Any:
        return _decoder(kind).decode(response.content)

    return read


def _reads_list(kind: Any) -> Callable[[httpx.Response], tuple]:
    def read(response: httpx.Response) -> tuple:
        return _decoder(models._DataList[kind]).decode(response.content).data

    return read


def _reads_secret(response: httpx.Response) -> str:
    return _decoder(models._Secret).decode(response.content).secret


def _reads_nothing(response: httpx.Response) -> None:
    return None


def _segment(value: Id | str) -> str:
    return quote(str(value), safe="")


def _json(fields: Mapping[str, Any]) -> bytes:
    return _ENCODER.encode({name: value for name, value in fields.items() if value is not UNSET})


def _params(**values: Any) -> dict[str, str]:
    """Query parameters that were given, as the API spells them."""
    params = {}
    for name, value in values.items():
        if value is None:
            continue
        params[name] = value.isoformat() if isinstance(value, datetime) else str(value)
    return params


# ---- operator -------------------------------------------------------------------------------------

def key_or_new(idempotency_key: str | None) -> str:
    """The caller's key, or a new one for this call: every retry of the call then carries it."""
    return idempotency_key or str(uuid.uuid4())


def _keyed(idempotency_key: str) -> dict[str, str]:
    return {IDEMPOTENCY_KEY_HEADER: idempotency_key}


def create_account(name: str, price_per_delivery: int | None, idempotency_key: str,
                   payload_retention_days: int | None = None) -> Call[models.AccountCreated]:
    """Idempotent through its key: a retry answers the first create's account and key."""
    body = _json({"name": name, "price_per_delivery": price_per_delivery if price_per_delivery is not None else UNSET,
                  "payload_retention_days": payload_retention_days if payload_retention_days is not None else UNSET})
    return Call("POST", "/v1/accounts", True, _reads(models.AccountCreated), body=body,
                headers=_keyed(idempotency_key))


def get_account(account_id: Id) -> Call[models.Account]:
    return Call("GET", f"/v1/accounts/{_segment(account_id)}", True, _reads(models.Account))


def update_account(account_id: Id, payload_retention_days: int) -> Call[models.Account]:
    # Sets a value: a repeat sets the same value again.
    return Call("PATCH", f"/v1/accounts/{_segment(account_id)}", True, _reads(models.Account),
                body=_json({"payload_retention_days": payload_retention_days}))


def top_up(account_id: Id, order_id: str, amount: int) -> Call[models.Topup]:
    body = _json({"order_id": order_id, "amount": amount})
    # Idempotent by order id: a repeat answers applied=false and adds nothing.
    return Call("POST", f"/v1/accounts/{_segment(account_id)}/topups", True, _reads(models.Topup), body=body)


def reverse_top_up(account_id: Id, order_id: str) -> Call[models.Topup]:
    path = f"/v1/accounts/{_segment(account_id)}/topups/{_segment(order_id)}/reversal"
    return Call("POST", path, True, _reads(models.Topup))


def dead_deliveries(limit: int | None, cursor: str | None) -> Call[models.Page[models.Delivery]]:
    return Call("GET", "/v1/dead-deliveries", True, _reads(models.Page[models.Delivery]),
                params=_params(limit=limit, cursor=cursor))


def dead_letters(*, limit: int | None, cursor: str | None, account_id: Id | None, endpoint_id: Id | None,
                 dead_reason: str | None, died_after: datetime | None,
                 died_before: datetime | None) -> Call[models.Page[models.DeadDelivery]]:
    params = _params(limit=limit, cursor=cursor, account_id=account_id, endpoint_id=endpoint_id,
                     dead_reason=dead_reason, died_after=died_after, died_before=died_before)
    return Call("GET", "/v1/operator/dead-deliveries", True, _reads(models.Page[models.DeadDelivery]), params=params)


def inspect_delivery(delivery_id: Id) -> Call[models.InspectedDelivery]:
    return Call("GET", f"/v1/operator/deliveries/{_segment(delivery_id)}", True, _reads(models.InspectedDelivery))


def disable_endpoint_as_operator(endpoint_id: Id) -> Call[models.Endpoint]:
    # Idempotent: an endpoint already off is answered as it is.
    return Call("POST", f"/v1/operator/endpoints/{_segment(endpoint_id)}/disable", True, _reads(models.Endpoint))


def delete_account(account_id: Id) -> Call[models.AccountDeletion]:
    # A repeat starts nothing more: the API records one deletion per account and resumes it.
    return Call("DELETE", f"/v1/accounts/{_segment(account_id)}", True, _reads(models.AccountDeletion))


def account_deletion(account_id: Id) -> Call[models.AccountDeletion]:
    return Call("GET", f"/v1/accounts/{_segment(account_id)}/deletion", True, _reads(models.AccountDeletion))


# ---- account --------------------------------------------------------------------------------------

def own_account() -> Call[models.Account]:
    return Call("GET", "/v1/account", True, _reads(models.Account))


def update_own_account(**settings: object) -> Call[models.Account]:
    """Only the settings given are sent; a None low_balance_threshold turns it off."""
    return Call("PATCH", "/v1/account", True, _reads(models.Account), body=_json(settings))


def expunge_message(message_id: Id) -> Call[models.MessageErased]:
    # Idempotent: a repeat answers the first erasure's time and author.
    return Call("POST", f"/v1/messages/{_segment(message_id)}/expunge", True, _reads(models.MessageErased))


def balance() -> Call[models.Balance]:
    return Call("GET", "/v1/balance", True, _reads(models.Balance))


def ledger(limit: int | None, cursor: str | None, delivery_id: Id | None) -> Call[models.Page[models.LedgerEntry]]:
    return Call("GET", "/v1/ledger", True, _reads(models.Page[models.LedgerEntry]),
                params=_params(limit=limit, cursor=cursor, delivery_id=delivery_id))


def create_api_key(idempotency_key: str) -> Call[models.NewApiKey]:
    return Call("POST", "/v1/api-keys", True, _reads(models.NewApiKey), headers=_keyed(idempotency_key))


def create_api_key_for(account_id: Id, idempotency_key: str) -> Call[models.NewApiKey]:
    return Call("POST", f"/v1/accounts/{_segment(account_id)}/api-keys", True, _reads(models.NewApiKey),
                headers=_keyed(idempotency_key))


def list_api_keys() -> Call[tuple[models.ApiKey, ...]]:
    return Call("GET", "/v1/api-keys", True, _reads_list(models.ApiKey))


def revoke_api_key(key_id: Id) -> Call[None]:
    return Call("DELETE", f"/v1/api-keys/{_segment(key_id)}", True, _reads_nothing)


def create_endpoint(url: str, *, description: str, event_types: Sequence[str] | None, timeout_ms: int | None,
                    enabled: bool, secret: str | None, idempotency_key: str, signing_key_type: str | None = None,
                    headers: Mapping[str, str] | None = None,
                    rate_limit_per_second: int | None = None) -> Call[models.Endpoint]:
    body = _json({
        "url": url, "description": description,
        "event_types": list(event_types) if event_types is not None else UNSET,
        "timeout_ms": timeout_ms if timeout_ms is not None else UNSET, "enabled": enabled,
        "secret": secret if secret is not None else UNSET,
        "signing_key_type": signing_key_type if signing_key_type is not None else UNSET,
        "headers": dict(headers) if headers is not None else UNSET,
        "rate_limit_per_second": rate_limit_per_second if rate_limit_per_second is not None else UNSET,
    })
    return Call("POST", "/v1/endpoints", True, _reads(models.Endpoint), body=body, headers=_keyed(idempotency_key))


def list_endpoints() -> Call[tuple[models.Endpoint, ...]]:
    return Call("GET", "/v1/endpoints", True, _reads_list(models.Endpoint))


def get_endpoint(endpoint_id: Id) -> Call[models.Endpoint]:
    return Call("GET", f"/v1/endpoints/{_segment(endpoint_id)}", True, _reads(models.Endpoint))


def update_endpoint(endpoint_id: Id, changes: Mapping[str, Any]) -> Call[models.Endpoint]:
    fields = {name: (list(value) if name == "event_types" and value is not None and value is not UNSET
                     else dict(value) if name == "headers" and value is not None and value is not UNSET else value)
              for name, value in changes.items()}
    return Call("PATCH", f"/v1/endpoints/{_segment(endpoint_id)}", True, _reads(models.Endpoint), body=_json(fields))


def delete_endpoint(endpoint_id: Id) -> Call[models.EndpointDeleted]:
    return Call("DELETE", f"/v1/endpoints/{_segment(endpoint_id)}", True, _reads(models.EndpointDeleted))


def rotate_secret(endpoint_id: Id, secret: str | None, idempotency_key: str,
                  signing_key_type: str | None = None) -> Call[str]:
    # Idempotent only through its key: a second rotation would push the secret receivers still
    # use out of the overlap, so a retry must answer the first rotation's secret instead.
    fields = {"secret": secret if secret is not None else UNSET,
              "signing_key_type": signing_key_type if signing_key_type is not None else UNSET}
    body = _json(fields) if secret is not None or signing_key_type is not None else None
    return Call("POST", f"/v1/endpoints/{_segment(endpoint_id)}/secret/rotate", True, _reads_secret, body=body,
                headers=_keyed(idempotency_key))


def get_secret(endpoint_id: Id) -> Call[str]:
    return Call("GET", f"/v1/endpoints/{_segment(endpoint_id)}/secret", True, _reads_secret)


def _reads_keyed(kind: Any, idempotency_key: str, replayed_field: str = "replayed") -> Callable[[httpx.Response], Any]:
    """A 202 of a keyed create (a send, a replay, a recovery), with its key and whether it was the
    stored answer (in `replayed_field`: a recovery's `replayed` lists its new deliveries)."""
    def read(response: httpx.Response) -> Any:
        answer = _decoder(kind).decode(response.content)
        replayed = response.headers.get(REPLAYED_HEADER, "").lower() == "true"
        return msgspec.structs.replace(answer, **{replayed_field: replayed}, idempotency_key=idempotency_key)

    return read


def send(event_type: str, payload: Any, idempotency_key: str,
         channels: Sequence[str] | None = None) -> Call[models.Message]:
    """Idempotent through its key: every attempt of this call carries the same one."""
    body = _json({"event_type": event_type, "payload": payload,
                  "channels": list(channels) if channels is not None else UNSET})
    return Call("POST", "/v1/messages", True, _reads_keyed(models.Message, idempotency_key), body=body,
                headers=_keyed(idempotency_key))


# ---- applications --------------------------------------------------------------------------------
# `application` is an application's id or its uid.

def create_application(name: str, *, uid: str | None, metadata: Mapping[str, str] | None,
                       rate_limit_per_second: int | None, idempotency_key: str) -> Call[models.Application]:
    body = _json({"name": name, "uid": uid if uid is not None else UNSET,
                  "metadata": dict(metadata) if metadata is not None else UNSET,
                  "rate_limit_per_second": rate_limit_per_second if rate_limit_per_second is not None else UNSET})
    return Call("POST", "/v1/applications", True, _reads(models.Application), body=body,
                headers=_keyed(idempotency_key))


def list_applications(limit: int | None, cursor: str | None) -> Call[models.Page[models.Application]]:
    return Call("GET", "/v1/applications", True, _reads(models.Page[models.Application]),
                params=_params(limit=limit, cursor=cursor))


def get_application(application: Id) -> Call[models.Application]:
    return Call("GET", f"/v1/applications/{_segment(application)}", True, _reads(models.Application))


def update_application(application: Id, changes: Mapping[str, Any]) -> Call[models.Application]:
    return Call("PATCH", f"/v1/applications/{_segment(application)}", True, _reads(models.Application),
                body=_json(changes))


def delete_application(application: Id) -> Call[models.ApplicationDeleted]:
    return Call("DELETE", f"/v1/applications/{_segment(application)}", True, _reads(models.ApplicationDeleted))


def send_to_application(application: Id, event_type: str, payload: Any, idempotency_key: str,
                        channels: Sequence[str] | None = None) -> Call[models.Message]:
    """Idempotent through its key, as `send`."""
    body = _json({"event_type": event_type, "payload": payload,
                  "channels": list(channels) if channels is not None else UNSET})
    return Call("POST", f"/v1/applications/{_segment(application)}/messages", True,
                _reads_keyed(models.Message, idempotency_key), body=body, headers=_keyed(idempotency_key))


def create_application_endpoint(application: Id, url: str, *, description: str, event_types: Sequence[str] | None,
                                timeout_ms: int | None, enabled: bool, secret: str | None,
                                idempotency_key: str) -> Call[models.Endpoint]:
    call = create_endpoint(url, description=description, event_types=event_types, timeout_ms=timeout_ms,
                           enabled=enabled, secret=secret, idempotency_key=idempotency_key)
    return Call("POST", f"/v1/applications/{_segment(application)}/endpoints", True, call.read, body=call.body,
                headers=call.headers)


def list_application_endpoints(application: Id) -> Call[tuple[models.Endpoint, ...]]:
    return Call("GET", f"/v1/applications/{_segment(application)}/endpoints", True, _reads_list(models.Endpoint))


def create_portal_link(application: Id) -> Call[models.PortalLink]:
    # Not repeated on a lost answer: a retry would make a second link (harmless, but not the one asked for).
    return Call("POST", f"/v1/applications/{_segment(application)}/portal-links", False, _reads(models.PortalLink))


def application_usage(application: Id, since: datetime | str | None,
                      until: datetime | str | None) -> Call[models.ApplicationUsage]:
    return Call("GET", f"/v1/applications/{_segment(application)}/usage", True, _reads(models.ApplicationUsage),
                params=_params(since=since, until=until))


# ---- event catalog --------------------------------------------------------------------------------

def create_event_type(name: str, *, description: str, schema: Any, archived: bool) -> Call[models.EventType]:
    # Idempotent by name: a repeat answers 409 event-type-exists and changes nothing.
    body = _json({"name": name, "description": description, "schema": schema, "archived": archived})
    return Call("POST", "/v1/event-types", True, _reads(models.EventType), body=body)


def list_event_types(limit: int | None, cursor: str | None,
                     include_archived: bool) -> Call[models.Page[models.EventType]]:
    return Call("GET", "/v1/event-types", True, _reads(models.Page[models.EventType]),
                params=_params(limit=limit, cursor=cursor, include_archived="true" if include_archived else None))


def get_event_type(name: str) -> Call[models.EventType]:
    return Call("GET", f"/v1/event-types/{_segment(name)}", True, _reads(models.EventType))


def update_event_type(name: str, changes: Mapping[str, Any]) -> Call[models.EventType]:
    return Call("PATCH", f"/v1/event-types/{_segment(name)}", True, _reads(models.EventType), body=_json(changes))


def list_deliveries(*, limit: int | None, cursor: str | None, state: str | None, endpoint_id: Id | None,
                    message_id: Id | None, created_after: datetime | None,
                    created_before: datetime | None) -> Call[models.Page[models.Delivery]]:
    params = _params(limit=limit, cursor=cursor, state=state, endpoint_id=endpoint_id, message_id=message_id,
                     created_after=created_after, created_before=created_before)
    return Call("GET", "/v1/deliveries", True, _reads(models.Page[models.Delivery]), params=params)


def get_delivery(delivery_id: Id) -> Call[models.DeliveryDetail]:
    return Call("GET", f"/v1/deliveries/{_segment(delivery_id)}", True, _reads(models.DeliveryDetail))


def replay_delivery(delivery_id: Id, idempotency_key: str) -> Call[models.Message]:
    """Idempotent through its key, as send is: every attempt of this call carries the same one."""
    return Call("POST", f"/v1/deliveries/{_segment(delivery_id)}/replay", True,
                _reads_keyed(models.Message, idempotency_key),
                headers=_keyed(idempotency_key))


def recover_plan(endpoint_id: Id, since: datetime | str, until: datetime | str | None) -> Call[models.RecoverPlan]:
    return Call("GET", f"/v1/endpoints/{_segment(endpoint_id)}/recover", True, _reads(models.RecoverPlan),
                params=_params(since=since, until=until))


def recover(endpoint_id: Id, since: datetime | str, until: datetime | str | None, confirm_total: int,
            idempotency_key: str) -> Call[models.Recovered]:
    """Idempotent through its key: a retry answers the first call's replays, not 409 total-changed.
    (Without the key a repeat could not charge twice either, each dead delivery being replayed at
    most once, but its answer would be lost.)"""
    body = _json({"since": since, "until": until if until is not None else UNSET, "confirm_total": confirm_total})
    return Call("POST", f"/v1/endpoints/{_segment(endpoint_id)}/recover", True,
                _reads_keyed(models.Recovered, idempotency_key, "idempotent_replayed"), body=body,
                headers=_keyed(idempotency_key))
