"""Print an audit report for people (rich tables) or machines (JSON)."""

from __future__ import annotations

import json

from rich.console import Console
from rich.table import Table

from billing.audit import INVARIANTS, AuditReport

SUMMARY_ROWS_MAX = 50  # accounts shown in the table (those with violations first); JSON has them all


def render(report: AuditReport, console: Console) -> None:
    summary = (
        f"{report.accounts} accounts, {report.deliveries} deliveries, {report.ledger_entries} ledger entries"
    )
    if report.since is not None:
        summary += f"; deliveries and entries since {report.since.isoformat()}"
    summary += (f"; {report.operational_deliveries} operational deliveries apart (free, outside the ledger,"
                " none charged)")
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
            # A notice about the schema (a guard the migrations create) names no account or delivery.
            table.add_row(str(notice.account_id or "-"), str(notice.delivery_id or "-"), notice.detail)
        console.print(table)
    _render_summaries(report, console)


def _render_summaries(report: AuditReport, console: Console) -> None:
    if not report.summaries:
        return
    shown = sorted(report.summaries, key=lambda s: (-s.violations, str(s.account_id)))[:SUMMARY_ROWS_MAX]
    hidden = len(report.summaries) - len(shown)
    title = "accounts" + (f" (first {len(shown)}; {hidden} more in --json)" if hidden else "")
    table = Table(title=title)
    for column in ("account", "status", "balance", "ledger sum", "live", "delivered", "dead", "violations"):
        table.add_column(column, justify="left" if column in ("account", "status") else "right")
    for s in shown:
        violations = f"[red]{s.violations}[/red]" if s.violations else "0"
        table.add_row(str(s.account_id), s.status, str(s.balance), str(s.ledger_total), str(s.live),
                      str(s.delivered), str(s.dead), violations)
    console.print(table)


def to_json(report: AuditReport) -> str:
    return json.dumps(report.to_json(), indent=2)
