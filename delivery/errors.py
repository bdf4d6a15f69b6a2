"""One root exception for the delivery package; each subclass's docstring is its message.

Sections belong to the modules that raise them. Add a new section for a new module rather than
editing another module's section.
"""

from __future__ import annotations


class DeliveryError(Exception):
    """A webhook could not be accepted, scheduled or sent."""

    def __init__(self, detail: str | None = None) -> None:
        # The docstring is the message, so the text an operator reads in a log is the text a
        # reader finds beside the class. The optional detail says which value was wrong.
        message = (self.__doc__ or type(self).__name__).strip()
        self.detail = detail
        super().__init__(f"{message} ({detail})" if detail else message)

    @property
    def reason(self) -> str:
        """The message without the detail, for a problem+json title."""
        return (self.__doc__ or type(self).__name__).strip()


# ---------------------------------------------------------------------------------------------
# Sending half: delivery/retry.py, delivery/ssrf.py, delivery/sender.py.
# ---------------------------------------------------------------------------------------------


class RetryScheduleError(DeliveryError, ValueError):
    """The retry schedule must be 1 to 50 comma-separated delays in seconds, each 0 to 604800."""


class RetrySettingsError(DeliveryError, ValueError):
    """A retry or auto-disable setting is out of its allowed range."""


class SenderSettingsError(DeliveryError, ValueError):
    """A sender setting is out of its allowed range."""


class SenderOverloadedError(DeliveryError):
    """More concurrent sends were started than SenderSettings.sends_pending_max allows (a caller bug)."""


class InvalidEndpointUrlError(DeliveryError, ValueError):
    """The endpoint URL is not acceptable."""


class AddressRefusedError(DeliveryError, OSError):
    """The endpoint's address is not one the platform may connect to."""

    # An OSError too, so that aiohttp carries it through its own connection plumbing (resolver
    # and socket factory failures) as the cause of a ClientConnectorError instead of letting
    # a foreign exception type escape mid-connect. The sender finds it again in the cause chain.

    def __init__(self, address: str, category: str) -> None:
        self.address = address
        self.category = category
        super().__init__(f"{address} is {category}")


# ---------------------------------------------------------------------------------------------
# Starting a process: delivery/database.py, delivery/queue.py.
# ---------------------------------------------------------------------------------------------


class ServerUnreachableError(DeliveryError):
    """A server the platform needs did not answer at start; is it running, and is its URL right?"""


def server_address(url: str) -> str:
    """Where a URL points, without its user or password: host:port, or the socket path."""
    from urllib.parse import parse_qs, urlsplit

    parts = urlsplit(url)
    if parts.hostname:
        return f"{parts.hostname}:{parts.port}" if parts.port else parts.hostname
    socket_path = parts.path if parts.scheme == "unix" else (parse_qs(parts.query).get("host") or [""])[0]
    return socket_path or url.split("://", 1)[0] + " (default address)"
