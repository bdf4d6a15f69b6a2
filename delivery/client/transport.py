"""What the sync and async clients share about one attempt: the request's headers, and the
judgement of its outcome (a result, a retry after some seconds, or an exception)."""

from __future__ import annotations

from typing import Any

import httpx
import msgspec

from delivery.client import errors, retry
from delivery.client.calls import Call

USER_AGENT = "hookledger-python/0.1"
TIMEOUT_SECONDS_DEFAULT = 10.0


def checked_base_url(base_url: str) -> str:
    """The API's base URL, refused early (ValueError) unless http(s)://host[:port][/prefix]."""
    try:
        url = httpx.URL(base_url)
    except (httpx.InvalidURL, TypeError) as error:
        raise ValueError(f"base_url is not a URL: {base_url!r} ({error})") from None
    if url.scheme not in ("http", "https") or not url.host:
        raise ValueError(f"base_url must be http(s)://host[:port]; got {base_url!r}")
    return base_url


def default_headers(api_key: str) -> dict[str, str]:
    if not api_key or not api_key.isprintable():
        raise ValueError("api_key must be a non-empty API key (hl_live_... or the operator key)")
    return {"Authorization": f"Bearer {api_key}", "User-Agent": USER_AGENT, "Accept": "application/json",
            "Content-Type": "application/json"}


def request_arguments(call: Call) -> dict[str, Any]:
    return {"method": call.method, "url": call.path, "params": call.params, "content": call.body,
            "headers": call.headers}


def judge_response(call: Call, response: httpx.Response, policy: retry.RetryPolicy,
                   retry_number: int, waited_seconds: float = 0.0) -> tuple[bool, Any]:
    """(True, result) when the call is done; (False, seconds) to retry; raises when neither.

    `waited_seconds`: the waits between this call's attempts so far (for a keyed call in doubt)."""
    if response.is_success:
        try:
            return True, call.read(response)
        except (msgspec.DecodeError, msgspec.ValidationError) as error:
            raise errors.ResponseDecodeError(
                f"{call.method} {call.path} answered {response.status_code} with a body this SDK cannot read: {error}",
                status=response.status_code, request_id=response.headers.get("X-Request-Id"),
            ) from None
    retry_after_seconds = retry.parse_retry_after(response.headers.get("Retry-After"))
    failure = errors.from_response(response, retry_after_seconds)
    failure.idempotency_key = call.idempotency_key
    if retry.retryable_status(response.status_code, failure.slug, call.idempotent):
        in_doubt = retry.outcome_in_doubt(response.status_code, failure.slug, call.idempotency_key is not None)
        delay = policy.delay_seconds(retry_number, retry_after_seconds, in_doubt=in_doubt,
                                     waited_seconds=waited_seconds)
        if delay is not None:
            return False, delay
    raise failure


def judge_transport_error(call: Call, error: httpx.TransportError, policy: retry.RetryPolicy,
                          retry_number: int) -> float:
    """Seconds to wait before retrying after `error`; raises APIConnectionError when it may not be retried."""
    if retry.retryable_error(error, call.idempotent):
        delay = policy.delay_seconds(retry_number, None)
        if delay is not None:
            return delay
    maybe_done = "" if isinstance(error, retry.NOT_SENT_ERRORS) else (
        "; the request may have been carried out, so it was not retried" if not call.idempotent else "")
    failure = errors.APIConnectionError(
        f"{call.method} {call.path}: {type(error).__name__}: {str(error) or 'no answer'}{maybe_done}"
    )
    failure.idempotency_key = call.idempotency_key
    raise failure from error
