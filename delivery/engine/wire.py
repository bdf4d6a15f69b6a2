"""The lean HTTP/1.1 client's connection: one POST at a time, the answer parsed by httptools.

A Connection is an asyncio.Protocol: the event loop calls it with each read, httptools (llhttp,
the parser uvicorn uses) calls it back with the parts of the answer, and it settles the send's
future when the answer is in, with no task and no stream per request. It keeps only what the
sender reads: the status, the reason, Retry-After, Date, whether the connection may be kept, and
at most excerpt_bytes_max bytes of the body. Everything it holds is bounded: a head larger than
HEAD_BYTES_MAX fails the send, and once the excerpt is full the connection is closed rather than
the rest of the body drained.

delivery.engine.wire_pool opens connections (the SSRF guard, TLS), keeps the idle ones and times
each send out; this module encodes requests and reads answers. Imports the send's texts
(send_outcome) and nothing else of ours.
"""

from __future__ import annotations

import asyncio
import errno
import re
import ssl
from collections.abc import Callable, Mapping

import httptools

from delivery.engine import send_outcome
from delivery.engine.send_outcome import Answer

# A response's status line and headers, every interim (1xx) response's included, before the head
# is complete: beyond this the send fails. aiohttp's own bound is 8 KiB per line.
HEAD_BYTES_MAX = 64 * 1024
# Header names already checked, kept for the hot path; emptied when full, which costs only a check.
NAMES_CHECKED_MAX = 4096
# Headers that frame the request or route it: ours alone to send (the API refuses them as custom
# headers too, delivery.store.endpoint_headers); one from a caller would let a body smuggle a request.
FRAMING_NAMES = frozenset({"host", "content-length", "transfer-encoding", "connection"})
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
# The body is written with the head in one piece up to this size, beyond it beside the head.
JOINED_WRITE_BYTES_MAX = 64 * 1024


class Exchange:
    """One send: its future (an Answer or a failure's text), its one timer, and where it is."""

    __slots__ = ("future", "timer", "timeout_ms", "connection", "connecting", "task")

    def __init__(self, future: asyncio.Future, timeout_ms: int) -> None:
        self.future = future
        self.timeout_ms = timeout_ms
        self.timer: asyncio.TimerHandle | None = None
        self.connection: Connection | None = None
        self.connecting = False  # past the DNS lookup, in the TCP connect or the TLS handshake
        self.task: asyncio.Task | None = None  # the connect of a new connection, while it runs

    def settle(self, outcome: Answer | str) -> None:
        timer = self.timer
        if timer is not None:
            timer.cancel()
        if not self.future.done():
            self.future.set_result(outcome)

    def expire(self) -> None:
        """The send's whole timeout ran out: in the connect, in the lookup, or on the wire."""
        if self.future.done():
            return
        if self.connection is not None:
            self.connection.time_out()
            return
        if self.connecting:
            self.settle(send_outcome.connect_timeout_text(self.timeout_ms))
        else:
            self.settle(send_outcome.timeout_text(self.timeout_ms))
        if self.task is not None:
            self.task.cancel()


class _ExtraMessage(Exception):
    """A second response on the connection before a second request: the receiver is not speaking HTTP to us."""


class Connection(asyncio.Protocol):
    """One connection to one host; sends one request at a time and parses its answer."""

    def __init__(self, key: tuple, excerpt_bytes_max: int, release: Callable[[Connection], None],
                 forget: Callable[[Connection], None]) -> None:
        self.key = key
        self.idle_since = 0.0
        self.closed = False
        self.transport: asyncio.Transport | None = None
        self._excerpt_bytes_max = excerpt_bytes_max
        self._release = release
        self._forget = forget
        self._parser = httptools.HttpResponseParser(self)
        self._exchange: Exchange | None = None
        self._reset_answer()

    def _reset_answer(self) -> None:
        self._head_bytes = 0
        self._head_complete = False
        self._message_complete = False
        self._keep_alive = False
        self._framed = False  # Content-Length or Transfer-Encoding: the body does not end at EOF
        self._status_code = 0
        self._reason = b""
        self._retry_after: bytes | None = None
        self._date: bytes | None = None
        self._chunks: list[bytes] = []
        self._kept = 0

    # The event loop's calls.

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        exchange = self._exchange
        if exchange is None:
            # A receiver talking out of turn on an idle connection: whatever it says, the next
            # request's answer would be read wrong.
            self.close()
            return
        if not self._head_complete:
            room = HEAD_BYTES_MAX - self._head_bytes
            if len(data) > room:
                # The head must end within the bound: parse only that much before looking.
                if not self._feed(data[:room]):
                    return
                if not self._head_complete:
                    self._finish(f"response head too large (over {HEAD_BYTES_MAX} bytes)", reusable=False)
                    return
                data = data[room:]
            self._head_bytes += len(data)
        if not self._feed(data):
            return
        if self._head_complete and self._status_code not in send_outcome.STATUS_CODES_STORABLE:
            self._finish(send_outcome.invalid_status_text(self._status_code), reusable=False)
        elif self._message_complete:
            self._finish(self._answer(None), reusable=self._keep_alive)
        elif self._head_complete and self._kept >= self._excerpt_bytes_max:
            # Never drain a body we do not keep: the connection goes instead.
            self._finish(self._answer(None), reusable=False)

    def _feed(self, data: bytes) -> bool:
        """Parse data; False when it is no HTTP answer and the send has ended."""
        try:
            self._parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as error:
            self._parse_failed(error)
            return False
        return True

    def connection_lost(self, error: Exception | None) -> None:
        self.closed = True
        self._forget(self)
        if self._exchange is None:
            return
        if not self._head_complete:
            self._finish(describe_lost(error), reusable=False)
        elif self._status_code not in send_outcome.STATUS_CODES_STORABLE:
            self._finish(send_outcome.invalid_status_text(self._status_code), reusable=False)
        elif self._framed:
            self._finish(self._answer(send_outcome.BODY_ERROR_PREFIX + describe_lost(error)), reusable=False)
        else:
            self._finish(self._answer(None), reusable=False)  # a body that ends where the connection does

    # httptools' calls.

    def on_message_begin(self) -> None:
        if self._message_complete:
            raise _ExtraMessage

    def on_status(self, status: bytes) -> None:
        self._reason += status  # llhttp may hand the reason over in pieces

    def on_header(self, name: bytes, value: bytes) -> None:
        lowered = name.lower()
        if lowered == b"retry-after":
            self._retry_after = value
        elif lowered == b"date":
            self._date = value
        elif lowered == b"content-length" or lowered == b"transfer-encoding":
            self._framed = True

    def on_headers_complete(self) -> None:
        status_code = self._parser.get_status_code()
        if 100 <= status_code <= 199 and status_code != 101:
            return  # an interim answer (100 Continue, 103 Early Hints): the real one follows
        self._status_code = status_code
        self._head_complete = True

    def on_body(self, body: bytes) -> None:
        room = self._excerpt_bytes_max - self._kept
        if room > 0:
            kept = body if len(body) <= room else body[:room]
            self._chunks.append(kept)
            self._kept += len(kept)

    def on_message_complete(self) -> None:
        if not self._head_complete:  # the end of an interim answer
            self._reason = b""
            self._retry_after = self._date = None
            self._framed = False
            return
        self._keep_alive = self._parser.should_keep_alive()
        self._message_complete = True

    # The pool's calls.

    def send(self, exchange: Exchange, head: bytes, body: bytes) -> None:
        if self._head_bytes or self._head_complete:
            self._reset_answer()
        self._exchange = exchange
        exchange.connection = self
        if len(body) <= JOINED_WRITE_BYTES_MAX:
            self.transport.write(head + body)
        else:
            self.transport.writelines((head, body))

    def time_out(self) -> None:
        """The send's timeout ran out on the wire: what arrived of the answer is kept, as aiohttp does."""
        timeout = send_outcome.timeout_text(self._exchange.timeout_ms)
        if self._head_complete and self._status_code in send_outcome.STATUS_CODES_STORABLE:
            self._finish(self._answer(send_outcome.BODY_ERROR_PREFIX + timeout), reusable=False)
        else:
            self._finish(timeout, reusable=False)

    def is_reusable(self) -> bool:
        return not self.closed and not self.transport.is_closing()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.transport.abort()
        self._forget(self)

    # Leaves.

    def _parse_failed(self, error: Exception) -> None:
        if self._message_complete:  # bytes after the answer: the answer stands, the connection goes
            self._finish(self._answer(None), reusable=False)
        elif self._head_complete and self._status_code in send_outcome.STATUS_CODES_STORABLE:
            self._finish(self._answer(send_outcome.BODY_ERROR_PREFIX + send_outcome.connection_error_text(error)),
                         reusable=False)
        else:
            self._finish(send_outcome.connection_error_text(error), reusable=False)

    def _answer(self, body_error: str | None) -> Answer:
        retry_after, date = self._retry_after, self._date
        return Answer(
            self._status_code,
            self._reason.decode("utf-8", "surrogateescape") if self._reason else None,
            None if retry_after is None else retry_after.decode("latin-1"),
            None if date is None else date.decode("latin-1"),
            b"".join(self._chunks),
            body_error,
        )

    def _finish(self, outcome: Answer | str, reusable: bool) -> None:
        exchange = self._exchange
        self._exchange = None
        exchange.connection = None
        exchange.settle(outcome)
        if reusable and self.is_reusable():
            self._release(self)
        else:
            self.close()


def describe_lost(error: BaseException | None) -> str:
    """The text for a connection that broke before its answer was in (None: the peer closed it)."""
    if error is None:
        return send_outcome.CONNECTION_RESET
    return describe_os_error(error)


def describe_os_error(error: BaseException) -> str:
    """The text for a connect or a read that failed, the same as the aiohttp client's."""
    if isinstance(error, (ssl.SSLError, ssl.CertificateError)):
        return send_outcome.tls_text(error)
    if isinstance(error, OSError):
        if error.errno == errno.ECONNREFUSED:
            return send_outcome.CONNECTION_REFUSED
        if error.errno in (errno.ECONNRESET, errno.EPIPE) or isinstance(error, ConnectionResetError):
            return send_outcome.CONNECTION_RESET
    return send_outcome.connection_error_text(error)


class RequestEncoder:
    """The bytes of a POST: request line, Host, the session's headers, the caller's, Content-Length.

    A header name that is not an RFC 7230 token, a value holding CR, LF or NUL, or a name that
    frames or routes the request is refused: nothing is sent (a customer's header must never add a
    header or a request). Names once checked are remembered, so the usual send checks only values.
    """

    def __init__(self, session_headers: Mapping[str, str]) -> None:
        for name, value in session_headers.items():
            assert header_refusal(name, value) is None, name
        self._session_lines = "".join(f"{name}: {value}\r\n" for name, value in session_headers.items())
        self._names_checked: set[str] = set()

    def prefix(self, target: str, host: str) -> bytes | str:
        """The part of the head that depends only on the URL (the caller caches it per URL), or the
        refusal's text for a target or host holding a space or a control character: yarl passes
        some hosts through as written ("exa mple.com"), and one must not split the request line."""
        if any(character <= " " or character == "\x7f" for character in target + host):
            return send_outcome.bounded(f"invalid url: space or control character in {host + target!r}")
        return f"POST {target} HTTP/1.1\r\nHost: {host}\r\n{self._session_lines}".encode("utf-8")

    def head(self, prefix: bytes, headers: Mapping[str, str], body_bytes: int) -> bytes | str:
        """The request's head, or the text of the refusal when a header may not be sent."""
        names_checked = self._names_checked
        lines = []
        for name, value in headers.items():
            if name not in names_checked or "\r" in value or "\n" in value or "\x00" in value:
                refusal = header_refusal(name, value)
                if refusal is not None:
                    return refusal
                if len(names_checked) >= NAMES_CHECKED_MAX:
                    names_checked.clear()
                names_checked.add(name)
            lines.append(f"{name}: {value}\r\n")
        lines.append(f"Content-Length: {body_bytes}\r\n\r\n")
        return prefix + "".join(lines).encode("utf-8")


def header_refusal(name: str, value: str) -> str | None:
    """Why a header may not be sent, or None."""
    if not _TOKEN.fullmatch(name):
        return send_outcome.bounded(f"not sent: header name {name[:64]!r} is not an HTTP token")
    if name.lower() in FRAMING_NAMES:
        return send_outcome.bounded(f"not sent: header {name!r} is the sender's own")
    if "\r" in value or "\n" in value or "\x00" in value:
        return send_outcome.bounded(f"not sent: header {name!r} has CR, LF or NUL in its value")
    return None
