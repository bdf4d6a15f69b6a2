"""Print an audit report for people (a rich table) or machines (JSON)."""

from __future__ import annotations

import json

from rich.console import Console
from rich.table import Table

from billing.audit import INVARIANTS, AuditReport


def render(report: AuditReport, console: Console) -> None:
    summary = (
        f"{report.accounts} accounts, {report.deliveries} deliveries, {report.ledger_entries} ledger entries"
    )
    if report.clean:
        console.print(f"[green]audit clean[/green]: {summary}; invariants {', '.join(INVARIANTS)} hold")
    else:
        table = Table(title=f"audit: {len(report.violations)} violations ({summary})")
        for column in ("invariant", "account", "delivery", "detail"):
            table.add_column(column)
        for violation in report.violations:
            table.add_row(violation.invariant, str(violation.account_id or "-"),
                          str(violation.delivery_id or "-"), violation.detail)
        console.print(table)
    if report.notices:
        table = Table(title=f"{len(report.notices)} notices (no invariant broken)")
        for column in ("account", "delivery", "detail"):
            table.add_column(column)
        for notice in report.notices:
            table.add_row(str(notice.account_id), str(notice.delivery_id), notice.detail)
        console.print(table)


def to_json(report: AuditReport) -> str:
    return json.dumps(report.to_json(), indent=2)
