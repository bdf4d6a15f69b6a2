"""Billing errors. One root; each subclass's docstring is its message.

Operating errors (bad input, not enough credits) are raised before anything is written, or
inside a transaction that then rolls back: a BillingError never leaves a partial write.
"""

from __future__ import annotations


class BillingError(Exception):
    """A billing operation was refused."""

    def __init__(self, detail: str | None = None, **context: object) -> None:
        self.detail = detail or (self.__doc__ or "").strip()
        self.context = context
        super().__init__(self.detail)


class InvalidInput(BillingError):
    """The request is malformed; nothing was written."""


class AccountNotFound(BillingError):
    """No such account."""


class AccountNotActive(BillingError):
    """The account is closing or deleted; it cannot send or be topped up."""


class InsufficientBalance(BillingError):
    """The balance cannot cover the charge; nothing was written."""


class TopupConflict(BillingError):
    """This order id was already used for a top-up of another amount."""


class BalanceLimitExceeded(BillingError):
    """The top-up or repair would take the balance past what an account can hold; nothing was written."""


class TopupUnknown(BillingError):
    """No top-up with this order id exists for this account."""


class IdempotencyConflict(BillingError):
    """This idempotency key was already used with a different request."""


class ApplicationNotFound(BillingError):
    """No such live application of the account; nothing was written."""


class DeliveryNotFound(BillingError):
    """No such delivery."""


class LedgerMismatch(BillingError):
    """The ledger disagrees with the delivery (missing or wrong charge); nothing was settled."""


class BulkSettleMismatch(BillingError):
    """The pre-check or the three counts of the bulk settlement disagree; nothing was settled."""

    def __init__(self, detail: str | None = None, *, mismatches: list | None = None, **context: object) -> None:
        super().__init__(detail, **context)
        self.mismatches = mismatches or []


class AccountNotClosable(BillingError):
    """The account still has live deliveries or is not closing; it cannot be closed out yet."""
