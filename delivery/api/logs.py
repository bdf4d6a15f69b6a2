"""Structured JSON logs (structlog), with the request id bound to every line of a request."""

from __future__ import annotations

import contextvars
import logging
import sys

import structlog
from aiohttp.http_exceptions import HttpProcessingError

from delivery import tracing

# The id of the request being served, added to every line logged while serving it. One
# ContextVar of our own: structlog's bind/unbind_contextvars cost 1.5% of the API's CPU under load.
REQUEST_ID: contextvars.ContextVar[str | None] = contextvars.ContextVar("hookledger_request_id", default=None)
_requests_logged = True  # whether the one line per request is written (level info or lower)


def requests_logged() -> bool:
    """Whether info lines are written; the per-request line is not even built when they are not."""
    return _requests_logged


def _add_request_id(_logger, _method: str, event: dict) -> dict:
    request_id = REQUEST_ID.get()
    if request_id is not None:
        event.setdefault("request_id", request_id)
    return event


class _CurrentStdout:
    """Whatever sys.stdout is at the moment of each write.

    structlog caches loggers on first use, and a handler keeps the stream it was given; both would
    otherwise hold on to the stdout of the moment of configuration, which a test runner (or a
    daemonizing parent) may have replaced and closed since.
    """

    def write(self, text: str) -> int:
        return sys.stdout.write(text)

    def flush(self) -> None:
        sys.stdout.flush()


_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


class ServerLog(logging.LoggerAdapter):
    """aiohttp's server logger, but a malformed request is one line at INFO, not an ERROR with a traceback.

    aiohttp's parser answers 400 to a request line or headers it cannot read (a port scanner, TLS
    sent to a plain port, a broken client) before any handler or middleware runs, and logs the
    error with its traceback: the client's mistake, paged like ours. Everything else is passed on.
    """

    def exception(self, msg, *args, exc_info=True, **kwargs) -> None:
        if isinstance(exc_info, HttpProcessingError):
            self._malformed(logging.INFO, args, exc_info)
            return
        super().exception(msg, *args, exc_info=exc_info, **kwargs)

    def debug(self, msg, *args, **kwargs) -> None:
        # aiohttp logs a first request with a method it cannot read at debug, with its traceback.
        if isinstance(kwargs.get("exc_info"), HttpProcessingError):
            self._malformed(logging.DEBUG, args, kwargs["exc_info"])
            return
        super().debug(msg, *args, **kwargs)

    def _malformed(self, level: int, args: tuple, error: HttpProcessingError) -> None:
        remote = args[0] if args else None
        reason = " ".join(str(error.message).split())[:MALFORMED_REASON_CHARS_MAX]  # one line, bounded
        self.logger.log(level, "malformed HTTP request from %s answered %s: %s", remote, error.code, reason)


MALFORMED_REASON_CHARS_MAX = 200
SERVER_LOG = ServerLog(logging.getLogger("aiohttp.server"), {})


def configure(level: str = "info") -> None:
    """JSON lines on stdout; the standard library's loggers (aiohttp, ours) go the same way."""
    global _requests_logged
    number = _LEVELS[level]
    _requests_logged = number <= logging.INFO
    shared = [
        _add_request_id,
        *tracing.log_processors(),  # trace_id and span_id, while tracing is on (configured before this)
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    structlog.configure(
        processors=[*shared, structlog.processors.format_exc_info, structlog.processors.JSONRenderer()],
        wrapper_class=structlog.make_filtering_bound_logger(number),
        logger_factory=structlog.PrintLoggerFactory(_CurrentStdout()),
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(_CurrentStdout())
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, structlog.processors.JSONRenderer()],
            foreign_pre_chain=[*shared, structlog.stdlib.add_logger_name, structlog.processors.format_exc_info],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(number)
    # aiohttp's own access log would duplicate our one line per request.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
