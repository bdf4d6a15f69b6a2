"""Errors as application/problem+json (RFC 9457): one exception type, one mapping from billing errors.

A handler raises `Problem` (or lets a `billing.errors` error escape); the middleware in
`middleware.py` turns it into a response. Every billing error maps to a status in one table,
`BILLING_STATUSES`, so a reader sees every money refusal and its HTTP meaning in one place.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec
from aiohttp import web

from billing import errors as billing_errors

CONTENT_TYPE = "application/problem+json"
TYPE_BASE = "https://hookledger.dev/problems/"

# Most specific first: the first class the error is an instance of wins.
BILLING_STATUSES: tuple[tuple[type[billing_errors.BillingError], int, str], ...] = (
    (billing_errors.AccountNotFound, 404, "not-found"),
    (billing_errors.DeliveryNotFound, 404, "not-found"),
    (billing_errors.ApplicationNotFound, 404, "not-found"),
    (billing_errors.TopupUnknown, 404, "not-found"),
    (billing_errors.InsufficientBalance, 402, "insufficient-balance"),
    (billing_errors.IdempotencyConflict, 422, "idempotency-key-reused"),
    (billing_errors.TopupConflict, 409, "topup-conflict"),
    (billing_errors.BalanceLimitExceeded, 409, "balance-limit-exceeded"),
    (billing_errors.AccountNotActive, 409, "account-not-active"),
    (billing_errors.AccountNotClosable, 409, "account-not-closable"),
    (billing_errors.InvalidInput, 422, "invalid-request"),
    (billing_errors.LedgerMismatch, 500, "ledger-mismatch"),
    (billing_errors.BulkSettleMismatch, 500, "ledger-mismatch"),
)

_TITLES = {
    400: "Bad request",
    401: "Unauthorized",
    402: "Insufficient balance",
    403: "Forbidden",
    404: "Not found",
    405: "Method not allowed",
    409: "Conflict",
    413: "Payload too large",
    415: "Unsupported media type",
    422: "Unprocessable request",
    500: "Internal server error",
    503: "Service unavailable",
}


class FieldError(msgspec.Struct):
    field: str
    message: str


class ProblemBody(msgspec.Struct, omit_defaults=True):
    type: str
    title: str
    status: int
    detail: str
    errors: list[FieldError] = []


@dataclass
class Problem(Exception):
    """An HTTP error to answer as problem+json."""

    status: int
    detail: str
    slug: str = "error"
    errors: list[FieldError] = field(default_factory=list)
    headers: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        super().__init__(self.detail)


def not_found(what: str = "resource") -> Problem:
    # The same answer for a missing row and another account's row: ids do not leak existence.
    return Problem(404, f"no such {what}", "not-found")


def validation(errors: list[FieldError], detail: str = "the request is not valid") -> Problem:
    return Problem(422, detail, "invalid-request", errors)


def from_billing(error: billing_errors.BillingError) -> Problem:
    for kind, status, slug in BILLING_STATUSES:
        if isinstance(error, kind):
            return Problem(status, error.detail, slug)
    return Problem(500, error.detail, "billing-error")


_ENCODER = msgspec.json.Encoder()


def response(problem: Problem) -> web.Response:
    body = ProblemBody(
        type=TYPE_BASE + problem.slug,
        title=_TITLES.get(problem.status, "Error"),
        status=problem.status,
        detail=problem.detail,
        errors=problem.errors,
    )
    return web.Response(
        status=problem.status, body=_ENCODER.encode(body), content_type=CONTENT_TYPE, headers=problem.headers
    )


def write_outcome_unknown(keyed: bool, look_for: str = "it among your deliveries", made: str = "the message") -> Problem:
    """The connection to the database broke while the write was committing and it could not be
    checked afterwards: what it wrote may exist. Say so, and how to retry without paying twice."""
    how = (f"retry with the same Idempotency-Key: you get {made} if it was written, and it is created if not"
           if keyed else f"it may have been written: look for {look_for} before retrying")
    return Problem(503, f"the database connection was lost while the write was committing; {how}",
                   "write-outcome-unknown", headers={"Retry-After": "1"})


def write_failed() -> Problem:
    """The connection broke while the write was committing and the database says nothing was written."""
    return Problem(503, "the database did not accept the write; nothing was written, retry", "write-failed",
                   headers={"Retry-After": "1"})


def key_in_use() -> Problem:
    """The first request with this Idempotency-Key is still in progress: its answer is not known yet."""
    return Problem(409, "a request with this Idempotency-Key is still in progress; retry shortly",
                   "idempotency-key-in-use", headers={"Retry-After": "1"})


def stored_answer_unreadable() -> Problem:
    """The request with this Idempotency-Key was carried out, but its stored answer was sealed
    under an at-rest key the keyring no longer holds: nothing is made again, and it cannot be shown."""
    return Problem(409, "the request with this Idempotency-Key was carried out, but its stored answer cannot be"
                   " opened with the current at-rest keys (HOOKLEDGER_SECRET_KEYS changed); nothing was done"
                   " again: look up what it made", "idempotency-answer-unreadable")
