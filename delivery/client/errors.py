"""The SDK's exceptions: one root, `HookledgerError`, and one subclass per kind of refusal.

The API answers every error as application/problem+json (RFC 9457): `type`, `title`, `status`,
`detail` and, for invalid requests, `errors` (one per field). The exception carries those fields
as they arrived, plus the request id the API logged the request under. Each subclass's docstring
is its default message.
"""

from __future__ import annotations

from dataclasses import dataclass

import httpx
import msgspec

DETAIL_FROM_TEXT_CHARS_MAX = 500  # a non-problem error body (a proxy's HTML page) is cut to this


@dataclass(frozen=True, slots=True)
class FieldError:
    """One invalid field of a request: `field` is a path like `event_types.0` or a parameter name."""

    field: str
    message: str


class _ProblemBody(msgspec.Struct):
    type: str = "about:blank"
    title: str = ""
    status: int | None = None
    detail: str = ""
    errors: list[FieldError] = []


class HookledgerError(Exception):
    """The hookledger API refused or failed the request."""

    def __init__(
        self,
        detail: str | None = None,
        *,
        status: int | None = None,
        type: str = "about:blank",  # noqa: A002 - the problem+json member's name
        title: str = "",
        errors: tuple[FieldError, ...] = (),
        request_id: str | None = None,
        retry_after_seconds: float | None = None,
    ) -> None:
        self.detail = detail or (self.__class__.__doc__ or "").strip()
        self.status = status
        self.type = type
        self.title = title
        self.errors = tuple(errors)
        self.request_id = request_id
        self.retry_after_seconds = retry_after_seconds
        # The Idempotency-Key the call carried (generated unless given): a create whose outcome
        # is in doubt is asked again with `idempotency_key=error.idempotency_key`, never anew.
        self.idempotency_key: str | None = None
        super().__init__(self.detail)

    @property
    def slug(self) -> str:
        """The last segment of `type`, e.g. `insufficient-balance`: stable, for code to branch on."""
        return self.type.rstrip("/").rsplit("/", 1)[-1]

    def __str__(self) -> str:
        head = f"{self.status} {self.title}: {self.detail}" if self.status else self.detail
        fields = "; ".join(f"{error.field}: {error.message}" for error in self.errors)
        return f"{head} ({fields})" if fields else head

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}(status={self.status!r}, type={self.type!r}, detail={self.detail!r})"


class ValidationError(HookledgerError):
    """The request is not valid (400 malformed JSON, 422 a field or parameter); `errors` says which."""


class AuthenticationError(HookledgerError):
    """The API key is missing or not valid (401)."""


class PermissionDeniedError(HookledgerError):
    """This key may not call this route: an account key on an operator route or the reverse (403)."""


class PaymentRequiredError(HookledgerError):
    """The balance cannot cover every delivery; nothing was written or charged (402)."""


class NotFoundError(HookledgerError):
    """No such resource, or it belongs to another account (404)."""


class ConflictError(HookledgerError):
    """The request conflicts with the current state (409); `slug` says how."""


class PayloadTooLargeError(HookledgerError):
    """The payload is larger than the API accepts (413)."""


class RateLimitError(HookledgerError):
    """Too many requests (429); retry after `retry_after_seconds`."""


class ServerError(HookledgerError):
    """The API failed (5xx). A 503 whose `slug` is overloaded, shutting-down or write-failed wrote
    nothing; after write-outcome-unknown or database-unavailable a write may have happened."""


class APIConnectionError(HookledgerError):
    """The API could not be reached, or the connection broke before an answer arrived."""


class ResponseDecodeError(HookledgerError):
    """The API answered success with a body this SDK cannot read (a version mismatch?)."""


_BY_STATUS: dict[int, type[HookledgerError]] = {
    400: ValidationError,
    401: AuthenticationError,
    402: PaymentRequiredError,
    403: PermissionDeniedError,
    404: NotFoundError,
    409: ConflictError,
    413: PayloadTooLargeError,
    422: ValidationError,
    429: RateLimitError,
}


def error_class(status: int) -> type[HookledgerError]:
    if status >= 500:
        return ServerError
    return _BY_STATUS.get(status, HookledgerError)


_PROBLEM = msgspec.json.Decoder(_ProblemBody)


def from_response(response: httpx.Response, retry_after_seconds: float | None = None) -> HookledgerError:
    """The exception for an error response: its problem+json fields, or what can be said without them."""
    status = response.status_code
    try:
        problem = _PROBLEM.decode(response.content)
    except (msgspec.DecodeError, msgspec.ValidationError):
        text = response.text.strip()[:DETAIL_FROM_TEXT_CHARS_MAX]
        problem = _ProblemBody(title=response.reason_phrase, detail=text or response.reason_phrase)
    return error_class(status)(
        problem.detail or problem.title or response.reason_phrase,
        status=status,
        type=problem.type,
        title=problem.title or response.reason_phrase,
        errors=tuple(problem.errors),
        request_id=response.headers.get("X-Request-Id"),
        retry_after_seconds=retry_after_seconds,
    )
