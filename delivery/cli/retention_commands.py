"""CLI commands for erasure and retention, through the SDK (the HTTP API):

    hookledger expunge MESSAGE_ID                                  erase a finished message's payload now
    hookledger retention [--set DAYS]                              your account's payload retention
    hookledger accounts update ACCOUNT_ID --payload-retention-days DAYS   (operator key)

A message with a delivery still pending or sending cannot be expunged yet: exit 1 with when to
ask again. Exit codes as the other API commands (see client_commands).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timezone
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.console import Console

from delivery.cli.client_commands import OPERATOR_KEY_NAMES, emit, print_account
from delivery.cli.common import API_URL_DEFAULT, AccountId, ApiKey, ApiUrl, AsJson, OperatorKey, accounts_app, api, check_ids

if TYPE_CHECKING:
    from delivery.client import models

RETENTION_DAYS_MIN, RETENTION_DAYS_MAX = 1, 3650  # the API's bounds (billing.accounts), checked there too

RetentionDays = Annotated[int, typer.Option(
    "--payload-retention-days", min=RETENTION_DAYS_MIN, max=RETENTION_DAYS_MAX, metavar="DAYS", show_default=False,
    help="Days a finished message's payload and its attempts' response excerpts are kept (1-3650).")]


def expunge(
    message_id: Annotated[str, typer.Argument(metavar="MESSAGE_ID", show_default=False, help="The message's id.")],
    api_url: ApiUrl = API_URL_DEFAULT, api_key: ApiKey = None, as_json: AsJson = False,
) -> None:
    """Erase a message's payload and its attempts' response excerpts and custom headers sent now; the rows
    and the ledger stay.

    Only once every delivery of the message has finished (delivered or dead). Again: the same answer.
    """
    check_ids((message_id, "message"))
    with api(api_url, api_key, as_json) as client:
        erased = client.messages.expunge(message_id)
    emit(erased, as_json, lambda console: console.print(
        f"message {erased.id} ({erased.event_type}): payload erased on"
        f" {erased.payload_erased_at.astimezone(timezone.utc):%Y-%m-%d %H:%M:%S} UTC by {erased.payload_erased_by}",
        markup=False, soft_wrap=True))


def _print_retention(account: models.Account) -> Callable[[Console], None]:
    return lambda console: console.print(
        f"payloads and response excerpts of finished messages are kept {account.payload_retention_days} days",
        markup=False, soft_wrap=True)


def retention(
    set_days: Annotated[Optional[int], typer.Option(
        "--set", min=RETENTION_DAYS_MIN, max=RETENTION_DAYS_MAX, metavar="DAYS", show_default=False,
        help="Keep them this many days (1-3650) from now on.")] = None,
    api_url: ApiUrl = API_URL_DEFAULT, api_key: ApiKey = None, as_json: AsJson = False,
) -> None:
    """Show (or --set) how many days your finished payloads and response excerpts are kept.

    After that the retention job erases them; the rows and the ledger are kept forever.
    """
    with api(api_url, api_key, as_json) as client:
        account = client.account() if set_days is None else client.update_account(payload_retention_days=set_days)
    emit(account, as_json, _print_retention(account))


@accounts_app.command("update")
def accounts_update(
    account_id: AccountId, payload_retention_days: RetentionDays,
    api_url: ApiUrl = API_URL_DEFAULT, api_key: OperatorKey = None, as_json: AsJson = False,
) -> None:
    """Change an account's settings: its payload retention."""
    check_ids((account_id, "account"))
    with api(api_url, api_key, as_json, key_names=OPERATOR_KEY_NAMES) as client:
        account = client.accounts.update(account_id, payload_retention_days=payload_retention_days)
    emit(account, as_json, print_account(account))
