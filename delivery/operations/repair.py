"""The repair path of a deletion that waits for one: show the bad rows and their corrections, apply.

A deletion stops in `waiting_repair` when live deliveries disagree with the ledger. `plan`
reads what the account's live deliveries need (billing.adjustments.propose: one scan, nothing
written); `apply` writes exactly those corrections as adjustment entries, or nothing if the
ledger changed since they were shown. Then `hookledger accounts delete ID` resumes the deletion.
The CLI applies only with `--apply` and a confirmation (or `--yes`).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import asyncpg
from rich.console import Console
from rich.table import Table

from billing import adjustments
from delivery.operations import deletion


@dataclass(frozen=True)
class RepairPlan:
    account_id: uuid.UUID
    deletion: deletion.DeletionState | None
    repairs: list[adjustments.Repair]

    @property
    def repairable(self) -> list[adjustments.Repair]:
        return [repair for repair in self.repairs if repair.repairable]

    @property
    def needs_a_person(self) -> list[adjustments.Repair]:
        return [repair for repair in self.repairs if not repair.repairable]

    @property
    def balance_change(self) -> int:
        return sum(repair.balance_change for repair in self.repairable)


async def plan(pool: asyncpg.Pool, account_id: uuid.UUID) -> RepairPlan:
    return RepairPlan(account_id, await deletion.read_deletion(pool, account_id),
                      await adjustments.propose(pool, account_id))


async def apply(pool: asyncpg.Pool, shown: RepairPlan) -> adjustments.Applied:
    """Apply the shown plan (all of it, in one transaction), or raise RepairChanged and write nothing."""
    return await adjustments.apply(pool, shown.account_id, shown.repairs)


def render(shown: RepairPlan, console: Console) -> None:
    state = shown.deletion
    if state is not None:
        console.print(f"deletion of account {shown.account_id}: [bold]{state.status}[/bold] (step {state.step})")
    if not shown.repairs:
        console.print("[green]no live delivery disagrees with the ledger[/green]: nothing to repair")
        return
    table = Table(title=f"{len(shown.repairs)} live deliveries disagree with the ledger")
    for column in ("delivery", "price", "problem", "adjustment entry", "amount", "then refund", "balance change"):
        table.add_column(column, justify="right" if column in ("price", "amount", "then refund", "balance change") else "left")
    for repair in shown.repairs:
        if repair.repairable:
            table.add_row(str(repair.delivery_id), str(repair.price), repair.problem, repair.adjustment_id,
                          str(repair.adjustment_amount), str(repair.refund_amount), str(repair.balance_change))
        else:
            table.add_row(str(repair.delivery_id), str(repair.price), f"[red]{repair.problem}[/red]", "-", "-", "-", "-")
    console.print(table)
    console.print(
        f"{len(shown.repairable)} repairable (each: the adjustment, then the delivery is marked dead"
        f" with its refund, as the bulk settlement would); balance change {shown.balance_change:+d} credits"
    )
    if shown.needs_a_person:
        console.print(f"[red]{len(shown.needs_a_person)} need a person[/red]: the deletion cannot finish until they are fixed")
