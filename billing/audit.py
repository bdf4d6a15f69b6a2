"""The audit: checks invariants I1-I7 of DESIGN.md, and our I8, over all accounts or one, set-based.

Each check is one SQL scan that returns the offending rows, never a query per delivery. A
clean audit returns no violations. Notices are facts worth a look that break no invariant
(a stale success that arrived after its account was deleted, which was never reclaimed).

Adjustment rule. A repair (billing.adjustments) writes `adjustment:<delivery_id>:<reason>`;
the schema keeps delivery_id for charge, refund and reclaim, so the audit ties an adjustment
to its delivery by that id. A `missing_charge` adjustment stands in for the charge (I1 counts
it as the delivery's one charge); a `charge_difference` adjustment corrects the charge's
amount (I1 adds it to the charge); every adjustment of a delivery counts in its net (I2).
An adjustment whose id is not exactly `adjustment:<delivery uuid>:<known reason>` is itself an
I1 violation. Only an id holding a UUID is tied to a delivery (and cast): one bad id never stops
the audit.

I4 also covers ledger entries on an account id that has no accounts row: the ledger's side of
the balance check is the whole ledger, and the report counts every entry.

I5 and I8 check each trigger against the statement the migrations run (billing.tables,
billing.references): it exists, is ENABLE ALWAYS, its definition (events, timing, level, columns,
WHEN, function) is the migration's, and its function's body is the migration's. Catalog reads only.

Incremental runs (`since`): the delivery checks cover the deliveries created or finished since,
and every delivery that got a ledger entry since (with all of its entries, whenever written); the
balance check (I4), the triggers and the per-account summary always cover everything.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import uuid
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass, field
from datetime import datetime

import asyncpg

from billing import references, tables
from billing.adjustments import REASONS as ADJUSTMENT_REASONS
from billing.database import Executor, connection_of

INVARIANTS = {
    "I1": "every delivery has exactly one charge of -price, on its own account",
    "I2": "net ledger of a delivery: -price if delivered or live, 0 if dead",
    "I3": "a refund only for a dead (or recovered) delivery, at most one; a reclaim only after a refund",
    "I4": "accounts.balance equals the sum of the account's ledger entries",
    "I5": "the ledger is append-only: its triggers exist, always fire, and are the migrations' own",
    "I6": "attempt fencing: no recorded attempt beyond the delivery's, and every delivered one has a 2xx",
    "I7": "a charge never takes a balance below zero",
    "I8": "references hold: the reference and keep-history triggers (billing.references) exist, always fire,"
          " and are the migrations' own",
}


@dataclass(frozen=True)
class Violation:
    invariant: str
    account_id: uuid.UUID | None
    delivery_id: uuid.UUID | None
    detail: str


@dataclass
class AccountSummary:
    account_id: uuid.UUID
    status: str
    balance: int
    ledger_total: int
    live: int
    delivered: int
    dead: int
    violations: int = 0

    def to_json(self) -> dict:
        data = asdict(self)
        data["account_id"] = str(self.account_id)
        return data


@dataclass
class AuditReport:
    violations: list[Violation] = field(default_factory=list)
    notices: list[Violation] = field(default_factory=list)
    accounts: int = 0
    deliveries: int = 0
    ledger_entries: int = 0
    summaries: list[AccountSummary] = field(default_factory=list)
    since: datetime | None = None

    @property
    def clean(self) -> bool:
        return not self.violations

    def to_json(self) -> dict:
        def row(v: Violation) -> dict:
            data = asdict(v)
            data["account_id"] = str(v.account_id) if v.account_id else None
            data["delivery_id"] = str(v.delivery_id) if v.delivery_id else None
            return data

        return {
            "clean": self.clean,
            "accounts": self.accounts,
            "deliveries": self.deliveries,
            "ledger_entries": self.ledger_entries,
            "since": self.since.isoformat() if self.since else None,
            "violations": [row(v) for v in self.violations],
            "notices": [row(v) for v in self.notices],
            "summary": [summary.to_json() for summary in self.summaries],
        }


# $1: an account id, or NULL for every account. {scope}: '' for a full run, or the `since` scope
# ($2), which limits the deliveries checked (see _scoped).
_DELIVERY_CHECKS = """
WITH {scope_cte}ledger AS (
    SELECT delivery_id,
        count(*) FILTER (WHERE kind = 'charge') AS charges,
        coalesce(sum(amount) FILTER (WHERE kind = 'charge'), 0) AS charge_amount,
        count(*) FILTER (WHERE kind = 'refund') AS refunds,
        count(*) FILTER (WHERE kind = 'reclaim') AS reclaims,
        min(seq) FILTER (WHERE kind = 'refund') AS refund_seq,
        min(seq) FILTER (WHERE kind = 'reclaim') AS reclaim_seq,
        sum(amount) AS net
    FROM ledger_entries
    WHERE delivery_id IS NOT NULL AND ($1::uuid IS NULL OR account_id = $1) {scope_entries}
    GROUP BY delivery_id
), adjustments AS (
    -- Every adjustment (few), read once: tied to a delivery by its id (see the adjustment rule
    -- above) when the id holds a UUID; well formed when it is exactly what billing.adjustments writes.
    SELECT {adjustment_delivery} AS delivery_id, split_part(id, ':', 3) AS reason,
        id ~ '{adjustment_id}' AS well_formed, id, account_id, amount, created_at
    FROM ledger_entries WHERE kind = 'adjustment' AND ($1::uuid IS NULL OR account_id = $1)
), adjusted AS (
    SELECT delivery_id,
        count(*) FILTER (WHERE reason = 'missing_charge') AS charges,
        coalesce(sum(amount) FILTER (WHERE reason IN ('missing_charge', 'charge_difference')), 0) AS charge_amount,
        sum(amount) AS net
    FROM adjustments
    WHERE delivery_id IS NOT NULL {scope_adjustments}
    GROUP BY delivery_id
), entries AS (
    SELECT coalesce(l.delivery_id, a.delivery_id) AS delivery_id,
        coalesce(l.charges, 0) + coalesce(a.charges, 0) AS charges,
        coalesce(l.charge_amount, 0) + coalesce(a.charge_amount, 0) AS charge_amount,
        coalesce(l.refunds, 0) AS refunds, coalesce(l.reclaims, 0) AS reclaims, l.refund_seq, l.reclaim_seq,
        coalesce(l.net, 0) + coalesce(a.net, 0) AS net
    FROM ledger l FULL JOIN adjusted a ON a.delivery_id = l.delivery_id
), joined AS (
    SELECT coalesce(d.id, e.delivery_id) AS delivery_id, d.account_id,
        d.state, d.price, e.charges, e.charge_amount, e.refunds, e.reclaims, e.refund_seq, e.reclaim_seq, e.net,
        d.id IS NULL AS orphan
    FROM (SELECT * FROM deliveries WHERE ($1::uuid IS NULL OR account_id = $1) {scope_deliveries}) d
    FULL JOIN entries e ON e.delivery_id = d.id
), suspects AS (
    -- Cheap boolean tests first; the messages below are built only for the few rows that fail one.
    SELECT * FROM joined
    WHERE orphan OR coalesce(charges, 0) <> 1 OR charge_amount <> -price
       OR coalesce(refunds, 0) > 1 OR coalesce(reclaims, 0) > coalesce(refunds, 0) OR reclaim_seq < refund_seq
       OR (state IN ('delivered', 'pending', 'sending') AND coalesce(net, 0) <> -price)
       OR (state = 'dead' AND coalesce(net, 0) <> 0)
       OR (state IN ('pending', 'sending') AND coalesce(refunds, 0) > 0)
       OR (state = 'delivered' AND coalesce(refunds, 0) > coalesce(reclaims, 0))
), problems AS (
    SELECT coalesce(account_id, (SELECT min(x.account_id::text)::uuid FROM ledger_entries x
                                 WHERE x.delivery_id = suspects.delivery_id)) AS account_id,
        delivery_id, array_remove(ARRAY[
        CASE WHEN orphan THEN 'I1:ledger entries for a delivery that does not exist' END,
        CASE WHEN NOT orphan AND coalesce(charges, 0) <> 1 THEN 'I1:' || coalesce(charges, 0) || ' charge entries' END,
        CASE WHEN NOT orphan AND charges = 1 AND charge_amount <> -price
            THEN 'I1:charge is ' || charge_amount || ', expected ' || -price END,
        CASE WHEN NOT orphan AND state IN ('delivered', 'pending', 'sending') AND coalesce(net, 0) <> -price
            THEN 'I2:net ' || coalesce(net, 0) || ' for a ' || state || ' delivery, expected ' || -price END,
        CASE WHEN NOT orphan AND state = 'dead' AND coalesce(net, 0) <> 0
            THEN 'I2:net ' || coalesce(net, 0) || ' for a dead delivery, expected 0' END,
        CASE WHEN coalesce(refunds, 0) > 1 OR coalesce(reclaims, 0) > 1 THEN 'I3:more than one refund or reclaim' END,
        CASE WHEN coalesce(reclaims, 0) > coalesce(refunds, 0) THEN 'I3:reclaim without a refund' END,
        CASE WHEN reclaim_seq < refund_seq
            THEN 'I3:reclaim (seq ' || reclaim_seq || ') written before the refund (seq ' || refund_seq || ')' END,
        CASE WHEN state IN ('pending', 'sending') AND coalesce(refunds, 0) > 0 THEN 'I3:refund on a live delivery' END,
        CASE WHEN state = 'delivered' AND coalesce(refunds, 0) > coalesce(reclaims, 0)
            THEN 'I3:refund on a delivered delivery that was not reclaimed' END
    ], NULL) AS found
    FROM suspects
)
-- Unnest only the rows with a problem (unnesting every row costs a row per check per delivery).
SELECT account_id, delivery_id, unnest(found) AS problem FROM problems WHERE cardinality(found) > 0
UNION ALL
-- An adjustment whose id ties it to no delivery (or names no known reason): credits that no
-- delivery explains. Reported, never cast: one bad id must not stop the audit.
SELECT account_id, NULL::uuid, CASE WHEN delivery_id IS NULL
    THEN 'I1:adjustment ' || id || ' is tied to no delivery: its id is not adjustment:<delivery id>:<reason>'
    ELSE 'I1:adjustment ' || id || ' has a reason the audit does not know ({adjustment_reasons})' END
FROM adjustments WHERE NOT well_formed {scope_malformed}
"""
# The deliveries an incremental run checks: created or finished (delivered or dead) since $2, or
# given a ledger entry since $2. Finished: a delivery marked dead without its refund, or delivered
# without a 2xx, writes no ledger entry, so only its finished_at shows it changed.
_SCOPE_CTE = """scope AS (
    SELECT id FROM deliveries WHERE (created_at >= $2 OR finished_at >= $2) AND ($1::uuid IS NULL OR account_id = $1)
    UNION
    SELECT coalesce(delivery_id, {adjustment_delivery}) FROM ledger_entries
    WHERE created_at >= $2 AND ($1::uuid IS NULL OR account_id = $1)
      AND (delivery_id IS NOT NULL OR (kind = 'adjustment' AND id ~ '{adjustment_tied}'))
), """

# An adjustment is tied to a delivery only by an id that starts with `adjustment:` and a UUID as
# PostgreSQL writes one (lower case, dashes in place); only such an id is ever cast to uuid.
_UUID = "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
_ADJUSTMENT_TIED = f"^adjustment:{_UUID}:"
_ADJUSTMENT_DELIVERY = f"CASE WHEN id ~ '{_ADJUSTMENT_TIED}' THEN substr(id, 12, 36)::uuid END"
# Exactly what billing.adjustments writes: adjustment:<delivery id>:<reason>.
_ADJUSTMENT_ID = f"{_ADJUSTMENT_TIED}({'|'.join(ADJUSTMENT_REASONS)})$"
_ADJUSTMENT_FORMATS = dict(adjustment_delivery=_ADJUSTMENT_DELIVERY, adjustment_tied=_ADJUSTMENT_TIED,
                           adjustment_id=_ADJUSTMENT_ID, adjustment_reasons=", ".join(ADJUSTMENT_REASONS))


def _scoped(query: str, since: datetime | None) -> str:
    """The query for a full run (since None) or an incremental one ($2 = since)."""
    if since is None:
        return query.format(scope_cte="", scope_entries="", scope_adjustments="", scope_deliveries="",
                            scope_fencing="", scope_notices="", scope_malformed="", **_ADJUSTMENT_FORMATS)
    return query.format(
        **_ADJUSTMENT_FORMATS,
        scope_cte=_SCOPE_CTE.format(**_ADJUSTMENT_FORMATS),
        scope_malformed="AND created_at >= $2",
        scope_entries="AND delivery_id IN (SELECT id FROM scope)",
        scope_adjustments="AND delivery_id IN (SELECT id FROM scope)",
        scope_deliveries="AND id IN (SELECT id FROM scope)",
        scope_fencing="AND (d.created_at >= $2 OR d.finished_at >= $2 OR d.state IN ('pending', 'sending'))",
        scope_notices="AND (d.created_at >= $2 OR d.finished_at >= $2"
                      " OR EXISTS (SELECT 1 FROM delivery_attempts t WHERE t.delivery_id = d.id AND t.finished_at >= $2))",
    )


# Per account: the cached balance, the ledger's sum (I4) and how many deliveries are in each state.
# A full join with the ledger: entries on an account id that has no accounts row (their reference
# check bypassed) come out as a row with `missing` set, and are counted like every other entry.
_SUMMARY = """
SELECT coalesce(a.id, l.account_id) AS account_id, a.id IS NULL AS missing, a.status, a.balance,
    coalesce(l.total, 0)::bigint AS ledger_total, coalesce(l.entries, 0) AS entries, coalesce(d.live, 0) AS live,
    coalesce(d.delivered, 0) AS delivered, coalesce(d.dead, 0) AS dead
FROM (SELECT id, status, balance FROM accounts WHERE $1::uuid IS NULL OR id = $1) a
FULL JOIN (
    SELECT account_id, sum(amount) AS total, count(*) AS entries FROM ledger_entries
    WHERE $1::uuid IS NULL OR account_id = $1 GROUP BY account_id
) l ON l.account_id = a.id
LEFT JOIN (
    SELECT account_id, count(*) FILTER (WHERE state IN ('pending', 'sending')) AS live,
        count(*) FILTER (WHERE state = 'delivered') AS delivered, count(*) FILTER (WHERE state = 'dead') AS dead
    FROM deliveries WHERE $1::uuid IS NULL OR account_id = $1 GROUP BY account_id
) d ON d.account_id = a.id
ORDER BY 1
"""
# I5 and I8: each trigger as the database has it (catalog reads, no table is touched), with the
# function it calls. NULL definition: no such trigger.
_TRIGGERS = """
SELECT t.relname AS table_name, t.trigger_name, coalesce(g.tgenabled = 'A', false) AS always,
    pg_get_triggerdef(g.oid) AS definition, p.oid::regprocedure::text AS function, l.lanname AS language,
    p.prosrc AS source
FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS t(relname, trigger_name, position)
LEFT JOIN pg_trigger g ON g.tgname = t.trigger_name AND g.tgrelid = t.relname::regclass
LEFT JOIN pg_proc p ON p.oid = g.tgfoid
LEFT JOIN pg_language l ON l.oid = p.prolang
ORDER BY t.position
"""
_FENCING_CHECK = """
SELECT d.account_id, d.id AS delivery_id, 'I6:attempt ' || max(a.attempt) || ' recorded beyond the delivery''s attempt ' || d.attempt AS problem
FROM deliveries d JOIN delivery_attempts a ON a.delivery_id = d.id
WHERE ($1::uuid IS NULL OR d.account_id = $1) {scope_fencing}
GROUP BY d.id HAVING max(a.attempt) > d.attempt
UNION ALL
SELECT d.account_id, d.id, 'I6:delivered without a 2xx attempt on record'
FROM deliveries d
WHERE d.state = 'delivered' AND ($1::uuid IS NULL OR d.account_id = $1) {scope_fencing}
  AND NOT EXISTS (SELECT 1 FROM delivery_attempts a WHERE a.delivery_id = d.id AND a.status_code BETWEEN 200 AND 299)
"""
# I1, the account half: every entry of a delivery is on the delivery's own account. A join, not
# a per-group text comparison inside the aggregate above, which cost more than the rest of it.
_ENTRY_ACCOUNT_CHECK = """
SELECT d.account_id, d.id AS delivery_id, 'I1:an entry is on another account' AS problem
FROM deliveries d JOIN ledger_entries l ON l.delivery_id = d.id
WHERE l.account_id <> d.account_id AND ($1::uuid IS NULL OR d.account_id = $1) {scope_fencing}
GROUP BY d.account_id, d.id
"""
_NEGATIVE_CHARGE_CHECK = """
SELECT account_id, delivery_id, 'I7:charge took the balance to ' || running AS problem FROM (
    SELECT account_id, delivery_id, kind, amount, sum(amount) OVER (PARTITION BY account_id ORDER BY seq) AS running
    FROM ledger_entries WHERE $1::uuid IS NULL OR account_id = $1
) t WHERE kind = 'charge' AND amount < 0 AND running < 0
"""
# Incremental I7: the running balance from each account's sum before the first entry since $2.
_NEGATIVE_CHARGE_CHECK_SINCE = """
WITH first AS (
    SELECT coalesce(min(seq), (SELECT coalesce(max(seq), 0) + 1 FROM ledger_entries)) AS seq
    FROM ledger_entries WHERE created_at >= $2
), base AS (
    SELECT account_id, sum(amount) AS total FROM ledger_entries
    WHERE seq < (SELECT seq FROM first) AND ($1::uuid IS NULL OR account_id = $1) GROUP BY account_id
)
SELECT account_id, delivery_id, 'I7:charge took the balance to ' || running AS problem FROM (
    SELECT l.account_id, l.delivery_id, l.kind, l.amount,
        coalesce(b.total, 0) + sum(l.amount) OVER (PARTITION BY l.account_id ORDER BY l.seq) AS running
    FROM ledger_entries l LEFT JOIN base b ON b.account_id = l.account_id
    WHERE l.seq >= (SELECT seq FROM first) AND ($1::uuid IS NULL OR l.account_id = $1)
) t WHERE kind = 'charge' AND amount < 0 AND running < 0
"""
_UNPAID_STALE_SUCCESS = """
SELECT d.account_id, d.id AS delivery_id,
    'a send succeeded after the delivery died on a ' || a.status || ' account; not reclaimed' AS problem
FROM deliveries d JOIN accounts a ON a.id = d.account_id
WHERE d.state = 'dead' AND a.status <> 'active' AND ($1::uuid IS NULL OR d.account_id = $1) {scope_notices}
  AND EXISTS (SELECT 1 FROM delivery_attempts t WHERE t.delivery_id = d.id AND t.status_code BETWEEN 200 AND 299)
"""

# A late 2xx on an active account is reclaimed when it is recorded, or by the next sweep when
# that step was lost (delivery.results.reclaim_late_successes): one still dead minutes later
# kept a refund for a delivery that arrived.
UNRECLAIMED_AFTER = "5 minutes"
_UNRECLAIMED_LATE_SUCCESS = """
SELECT d.account_id, d.id AS delivery_id,
    'I2:a send succeeded after the delivery died and was refunded, and the refund was not reclaimed' AS problem
FROM deliveries d JOIN accounts a ON a.id = d.account_id
WHERE d.state = 'dead' AND a.status = 'active' AND ($1::uuid IS NULL OR d.account_id = $1) {scope_notices}
  AND EXISTS (SELECT 1 FROM delivery_attempts t WHERE t.delivery_id = d.id AND t.status_code BETWEEN 200 AND 299
              AND t.finished_at < now() - interval '""" + UNRECLAIMED_AFTER + """')
"""


@dataclass(frozen=True)
class _ExpectedTrigger:
    """A trigger as the migrations create it: its CREATE TRIGGER statement and its function's source."""

    invariant: str
    table: str
    name: str
    statement: str
    language: str
    source: str  # the function's body, as pg_proc.prosrc keeps it (the text between the $$)


_CREATE_FUNCTION = re.compile(r"\s*CREATE FUNCTION (\w+)\(\) RETURNS trigger LANGUAGE (\w+) AS \$\$(.*)\$\$\s*", re.S)
# pg_get_triggerdef's shape, which is also the shape of our own CREATE TRIGGER statements.
_TRIGGER_DEFINITION = re.compile(
    r"CREATE (?P<constraint>CONSTRAINT )?TRIGGER (?P<name>\w+) (?P<timing>BEFORE|AFTER|INSTEAD OF) (?P<events>.+?)"
    r" ON (?:\w+\.)?(?P<table>\w+) (?P<rest>.*?)\s*EXECUTE (?:FUNCTION|PROCEDURE) (?:\w+\.)?(?P<function>\w+)"
    r"\((?P<arguments>.*)\)", re.S | re.I)
_EVENT_ORDER = ("INSERT", "DELETE", "UPDATE", "TRUNCATE")  # pg_get_triggerdef's order


def _canonical_trigger(definition: str) -> str:
    """A trigger definition with what PostgreSQL's deparsing changes taken out: case, schema
    qualification, the order of the events and of UPDATE OF's columns, the parentheses and spacing
    of a WHEN clause. What it fires on, when, at which level, under which condition and what it
    calls are all kept."""
    match = _TRIGGER_DEFINITION.fullmatch(definition.strip())
    if match is None:
        return " ".join(definition.split()).lower()
    events = []
    for event in match["events"].upper().split(" OR "):
        kind, _, columns = event.strip().partition(" OF ")
        events.append(kind + (" OF " + ", ".join(sorted(c.strip() for c in columns.split(","))) if columns else ""))
    events.sort(key=lambda event: _EVENT_ORDER.index(event.split()[0]) if event.split()[0] in _EVENT_ORDER else 99)
    rest = " ".join(match["rest"].replace("(", " ").replace(")", " ").split())
    return " ".join([
        f"{match['constraint'] or ''}TRIGGER {match['name']} {match['timing']} {' OR '.join(events)}",
        f"ON {match['table']} {rest} EXECUTE FUNCTION {match['function']}({match['arguments'].strip()})",
    ]).lower()


def _expected_triggers() -> list[_ExpectedTrigger]:
    """Every trigger I5 and I8 check, from the very statements the migrations run: the append-only
    triggers of billing.tables (0001) and the reference triggers of billing.references (0005)."""
    statements = (tables.APPEND_ONLY_FUNCTION, *tables.APPEND_ONLY_TRIGGERS, *references.upgrade_statements())
    functions = {m[1]: (m[2], m[3]) for m in map(_CREATE_FUNCTION.fullmatch, statements) if m}
    creates = {m["name"]: (m, statement) for statement in statements
               if (m := _TRIGGER_DEFINITION.fullmatch(statement.strip()))}
    append_only = [_TRIGGER_DEFINITION.fullmatch(statement) for statement in tables.APPEND_ONLY_TRIGGERS]
    wanted = [("I5", match["table"], match["name"]) for match in append_only]
    wanted += [("I8", table, name) for table, name in references.trigger_names()]
    expected = []
    for invariant, table, name in wanted:
        match, statement = creates[name]
        assert match["table"] == table, (name, match["table"], table)
        language, source = functions[match["function"]]
        expected.append(_ExpectedTrigger(invariant, table, name, statement, language, source))
    return expected


_EXPECTED_TRIGGERS = _expected_triggers()


def _digest(text: str | None) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12] if text is not None else "none"


async def _trigger_violations(connection) -> list[Violation]:
    """I5 and I8: each trigger exists, is ENABLE ALWAYS, fires on what the migration says (events,
    timing, level, columns, WHEN, transition table, function), and its function's body is the
    migration's, byte for byte. A trigger can be recreated under its name, or its function replaced
    (CREATE OR REPLACE), without its name or its enabled state showing it."""
    rows = {(row["table_name"], row["trigger_name"]): row for row in await connection.fetch(
        _TRIGGERS, [t.table for t in _EXPECTED_TRIGGERS], [t.name for t in _EXPECTED_TRIGGERS])}
    violations, functions_seen = [], set()
    for expected in _EXPECTED_TRIGGERS:
        row = rows[expected.table, expected.name]
        name = f"trigger {expected.name} on {expected.table}"
        if row["definition"] is None:
            violations.append(Violation(expected.invariant, None, None, f"{name} does not exist"))
            continue
        if not row["always"]:
            violations.append(Violation(expected.invariant, None, None, f"{name} is not enabled always"))
        if _canonical_trigger(row["definition"]) != _canonical_trigger(expected.statement):
            violations.append(Violation(
                expected.invariant, None, None,
                f"{name} is not the one the migrations create: it is `{row['definition']}`,"
                f" expected `{expected.statement}`"))
        if (expected.invariant, row["function"]) in functions_seen:
            continue
        functions_seen.add((expected.invariant, row["function"]))
        if (row["language"], row["source"]) != (expected.language, expected.source):
            violations.append(Violation(
                expected.invariant, None, None,
                f"function {row['function']} of {name} is not the one the migrations create:"
                f" {row['language']} source sha256 {_digest(row['source'])}, expected {expected.language}"
                f" source sha256 {_digest(expected.source)}"))
    return violations


def _violation(row, problem: str | None = None) -> Violation:
    invariant, _, detail = (problem or row["problem"]).partition(":")
    return Violation(invariant, row["account_id"], row["delivery_id"], detail)


async def audit(
    executor: Executor, account_id: uuid.UUID | None = None, *, since: datetime | None = None
) -> AuditReport:
    """Check I1-I8 over one account or all, in one repeatable-read snapshot.

    `since`: an incremental run (see the module docstring); the balances are always all checked.
    """
    arguments = (account_id,) if since is None else (account_id, since)
    negative_charge = _NEGATIVE_CHARGE_CHECK if since is None else _NEGATIVE_CHARGE_CHECK_SINCE
    async with _snapshot(executor) as connection:
        report = AuditReport(since=since)
        summaries = await connection.fetch(_SUMMARY, account_id)
        for row in await connection.fetch(_scoped(_DELIVERY_CHECKS, since), *arguments):
            report.violations.append(_violation(row))
        for row in summaries:
            if row["missing"]:
                report.violations.append(
                    Violation("I4", row["account_id"], None,
                              f"no such account, yet the ledger has {row['entries']}"
                              f" {'entry' if row['entries'] == 1 else 'entries'} on it, summing to {row['ledger_total']}")
                )
            elif row["balance"] != row["ledger_total"]:
                report.violations.append(
                    Violation("I4", row["account_id"], None,
                              f"balance {row['balance']} but the ledger sums to {row['ledger_total']}")
                )
        report.violations.extend(await _trigger_violations(connection))
        for query in (_scoped(_FENCING_CHECK, since), _scoped(_ENTRY_ACCOUNT_CHECK, since), negative_charge,
                      _scoped(_UNRECLAIMED_LATE_SUCCESS, since)):
            report.violations.extend(_violation(row) for row in await connection.fetch(query, *arguments))
        report.notices.extend(
            Violation("notice", row["account_id"], row["delivery_id"], row["problem"])
            for row in await connection.fetch(_scoped(_UNPAID_STALE_SUCCESS, since), *arguments)
        )
    _summarize(report, summaries)
    return report


def _summarize(report: AuditReport, rows) -> None:
    """Totals and one summary per account, each with the number of violations on that account."""
    by_account: dict[uuid.UUID, int] = {}
    for violation in report.violations:
        if violation.account_id is not None:
            by_account[violation.account_id] = by_account.get(violation.account_id, 0) + 1
    accounts = [row for row in rows if not row["missing"]]
    report.accounts = len(accounts)
    report.deliveries = sum(row["live"] + row["delivered"] + row["dead"] for row in accounts)
    report.ledger_entries = sum(row["entries"] for row in rows)  # those on a missing account too
    report.summaries = [
        AccountSummary(row["account_id"], row["status"], row["balance"], row["ledger_total"], row["live"],
                       row["delivered"], row["dead"], by_account.get(row["account_id"], 0))
        for row in accounts
    ]


@contextlib.asynccontextmanager
async def _snapshot(executor: Executor) -> AsyncIterator[asyncpg.Connection]:
    """A read-only repeatable-read transaction: every check sees the same moment."""
    async with connection_of(executor) as connection, \
            connection.transaction(isolation="repeatable_read", readonly=True):
        yield connection
