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

Two guards the migrations create are checked the same way, and reported as notices (they keep
no money right, so a clean audit stays clean and `hookledger audit` exits 0):
  - the probe setting (0006, billing.references.PROBE_SETTING): each reference check function
    runs with exactly the settings the migrations give it (`enable_seqscan = off`); without it a
    check's probes can turn into sequential scans and creates slow down with every message written;
  - the key revocation trigger (0004, billing.tables.KEY_REVOKED_TRIGGER): it exists, fires at
    least whenever the migration's does (the migration leaves it plain ENABLE, not ALWAYS), is the
    migration's, and its function's body is the migration's; without it a revoked API key keeps
    working in the API processes' auth caches until its entry expires (delivery.api.auth).
All the catalog reads (I5, I8 and the guards) are one query.

Operational deliveries (billing.operational_outbox) are free and live beside deliveries, never
in the ledger: the report counts them apart (operational_deliveries), and I1 also holds that no
ledger entry names one (the check below; the reference triggers refuse such an entry anyway).

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
    operational_deliveries: int = 0  # free, outside the ledger: counted apart, not in I1-I8's totals
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
            "operational_deliveries": self.operational_deliveries,
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
# without a 2xx, writes no ledger entry, so only its finished_at shows it changed. Each by its
# account and id, so that the deliveries are read by their key (account_id, id): an entry written
# on another account than its delivery's names a delivery that account does not have, and is
# reported as such (I1), as the entry-account check reports it too.
_SCOPE_CTE = """scope AS (
    SELECT account_id, id FROM deliveries WHERE (created_at >= $2 OR finished_at >= $2)
      AND ($1::uuid IS NULL OR account_id = $1)
    UNION
    SELECT account_id, coalesce(delivery_id, {adjustment_delivery}) FROM ledger_entries
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
        scope_deliveries="AND (account_id, id) IN (SELECT account_id, id FROM scope)",
        scope_fencing="AND (d.created_at >= $2 OR d.finished_at >= $2 OR d.state IN ('pending', 'sending'))",
        scope_notices="AND (d.created_at >= $2 OR d.finished_at >= $2"
                      " OR EXISTS (SELECT 1 FROM delivery_attempts t WHERE t.account_id = d.account_id"
                      " AND t.delivery_id = d.id AND t.finished_at >= $2))",
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
# I5, I8 and the guards, in one read of the catalog (no table is touched): each trigger as the
# database has it, with the function it calls (NULL definition: no such trigger; enabled is
# pg_trigger.tgenabled), then each function whose settings the migrations fix, with its settings
# (NULL function: no such function).
_CATALOG = """
SELECT 'trigger' AS kind, t.position, t.relname AS table_name, t.trigger_name AS name, g.tgenabled::text AS enabled,
    pg_get_triggerdef(g.oid) AS definition, p.oid::regprocedure::text AS function, l.lanname AS language,
    p.prosrc AS source, NULL::text[] AS config
FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS t(relname, trigger_name, position)
LEFT JOIN pg_trigger g ON g.tgname = t.trigger_name AND g.tgrelid = t.relname::regclass
LEFT JOIN pg_proc p ON p.oid = g.tgfoid
LEFT JOIN pg_language l ON l.oid = p.prolang
UNION ALL
SELECT 'function', f.position, NULL, f.signature, NULL, NULL, p.oid::regprocedure::text, NULL, NULL, p.proconfig
FROM unnest($3::text[]) WITH ORDINALITY AS f(signature, position)
LEFT JOIN pg_proc p ON p.oid = to_regprocedure(f.signature)
ORDER BY 1, 2
"""
# An attempt is its delivery's by the key (account_id, delivery_id, attempt): joined on the account
# too, each probe is one of the attempts' primary key (the attempt's account is its delivery's, which
# the reference checks enforce: billing.references).
_FENCING_CHECK = """
SELECT d.account_id, d.id AS delivery_id, 'I6:attempt ' || max(a.attempt) || ' recorded beyond the delivery''s attempt ' || d.attempt AS problem
FROM deliveries d JOIN delivery_attempts a ON a.account_id = d.account_id AND a.delivery_id = d.id
WHERE ($1::uuid IS NULL OR d.account_id = $1) {scope_fencing}
GROUP BY d.account_id, d.id HAVING max(a.attempt) > d.attempt
UNION ALL
SELECT d.account_id, d.id, 'I6:delivered without a 2xx attempt on record'
FROM deliveries d
WHERE d.state = 'delivered' AND ($1::uuid IS NULL OR d.account_id = $1) {scope_fencing}
  AND NOT EXISTS (SELECT 1 FROM delivery_attempts a WHERE a.account_id = d.account_id AND a.delivery_id = d.id
                  AND a.status_code BETWEEN 200 AND 299)
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
  AND EXISTS (SELECT 1 FROM delivery_attempts t WHERE t.account_id = d.account_id AND t.delivery_id = d.id
              AND t.status_code BETWEEN 200 AND 299)
"""

# A late 2xx on an active account is reclaimed when it is recorded, or by the next sweep when
# that step was lost (delivery.engine.results.reclaim_late_successes): one still dead minutes later
# kept a refund for a delivery that arrived.
UNRECLAIMED_AFTER = "5 minutes"
_UNRECLAIMED_LATE_SUCCESS = """
SELECT d.account_id, d.id AS delivery_id,
    'I2:a send succeeded after the delivery died and was refunded, and the refund was not reclaimed' AS problem
FROM deliveries d JOIN accounts a ON a.id = d.account_id
WHERE d.state = 'dead' AND a.status = 'active' AND ($1::uuid IS NULL OR d.account_id = $1) {scope_notices}
  AND EXISTS (SELECT 1 FROM delivery_attempts t WHERE t.account_id = d.account_id AND t.delivery_id = d.id
              AND t.status_code BETWEEN 200 AND 299 AND t.finished_at < now() - interval '""" + UNRECLAIMED_AFTER + """')
"""


NOTICE = "notice"  # the `invariant` of a notice: a fact worth a look that breaks no invariant


@dataclass(frozen=True)
class _ExpectedTrigger:
    """A trigger as the migrations create it: its CREATE TRIGGER statement, the enabled state they
    leave it in, and its function's source. A guard's trigger (invariant NOTICE) also says what it
    costs while it is not the migrations' own."""

    invariant: str
    table: str
    name: str
    statement: str
    enabled: str  # pg_trigger.tgenabled as the migrations leave it (see _ENABLED_STATES)
    language: str
    source: str  # the function's body, as pg_proc.prosrc keeps it (the text between the $$)
    cost: str = ""


_CREATE_FUNCTION = re.compile(r"\s*CREATE (?:OR REPLACE )?FUNCTION (\w+)\(\) RETURNS trigger LANGUAGE (\w+) AS \$\$(.*)\$\$\s*", re.S)
# pg_get_triggerdef's shape, which is also the shape of our own CREATE TRIGGER statements.
_TRIGGER_DEFINITION = re.compile(
    r"CREATE (?P<constraint>CONSTRAINT )?TRIGGER (?P<name>\w+) (?P<timing>BEFORE|AFTER|INSTEAD OF) (?P<events>.+?)"
    r" ON (?:\w+\.)?(?P<table>\w+) (?P<rest>.*?)\s*EXECUTE (?:FUNCTION|PROCEDURE) (?:\w+\.)?(?P<function>\w+)"
    r"\((?P<arguments>.*)\)", re.S | re.I)
_EVENT_ORDER = ("INSERT", "DELETE", "UPDATE", "TRUNCATE")  # pg_get_triggerdef's order
_ENABLE_TRIGGER = re.compile(
    r"\s*ALTER TABLE (?:\w+\.)?(?P<table>\w+) (?P<how>ENABLE ALWAYS|ENABLE REPLICA|ENABLE|DISABLE)"
    r" TRIGGER (?P<name>\w+)\s*", re.I)
# pg_trigger.tgenabled for each way of enabling a trigger; CREATE TRIGGER leaves it O.
_ENABLED_STATES = {"ENABLE ALWAYS": "A", "ENABLE REPLICA": "R", "ENABLE": "O", "DISABLE": "D"}
# The session_replication_role values under which a trigger in each state fires.
_FIRES_UNDER = {"O": {"origin", "local"}, "A": {"origin", "local", "replica"}, "R": {"replica"}, "D": set()}
_STATE_NAMES = {
    "O": "plain ENABLE (fires unless session_replication_role = replica)",
    "A": "ENABLE ALWAYS",
    "R": "ENABLE REPLICA (fires only under session_replication_role = replica, so not on ordinary writes)",
    "D": "disabled",
}


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


def _triggers_created_by(statements, wanted: list[tuple[str, str, str]], cost: str = "") -> list[_ExpectedTrigger]:
    """The triggers `wanted` ((invariant, table, name)) as these statements, run in order, leave
    them: the CREATE TRIGGER, the last ALTER TABLE ... ENABLE/DISABLE TRIGGER after it (none: O),
    and the CREATE FUNCTION of the function it calls."""
    functions, creates, enabled = {}, {}, {}
    for statement in statements:
        if function := _CREATE_FUNCTION.fullmatch(statement):
            functions[function[1]] = (function[2], function[3])
        elif create := _TRIGGER_DEFINITION.fullmatch(statement.strip()):
            creates[create["name"]] = (create, statement)
            enabled[create["table"], create["name"]] = "O"
        elif enable := _ENABLE_TRIGGER.fullmatch(statement):
            enabled[enable["table"], enable["name"]] = _ENABLED_STATES[" ".join(enable["how"].upper().split())]
    expected = []
    for invariant, table, name in wanted:
        match, statement = creates[name]
        assert match["table"] == table, (name, match["table"], table)
        language, source = functions[match["function"]]
        expected.append(_ExpectedTrigger(invariant, table, name, statement, enabled[table, name], language, source,
                                         cost))
    return expected


def _expected_triggers() -> list[_ExpectedTrigger]:
    """Every trigger I5 and I8 check, from the very statements the migrations run: the append-only
    triggers of billing.tables (0001) and the reference triggers of billing.references (0005, and
    the messages and deliveries ones as 0016 makes them again, and the functions 0024 replaces)."""
    statements = (tables.APPEND_ONLY_FUNCTION, *tables.APPEND_ONLY_TRIGGERS, *tables.APPEND_ONLY_ENABLE_ALWAYS,
                  *references.upgrade_statements(), *references.application_check_statements(),
                  *references.account_named_check_statements())
    append_only = [_TRIGGER_DEFINITION.fullmatch(statement) for statement in tables.APPEND_ONLY_TRIGGERS]
    wanted = [("I5", match["table"], match["name"]) for match in append_only]
    wanted += [("I8", table, name) for table, name in references.trigger_names()]
    expected = _triggers_created_by(statements, wanted)
    # I5 and I8 say these always fire: the migrations must leave them so.
    assert all(trigger.enabled == "A" for trigger in expected), [(t.name, t.enabled) for t in expected]
    return expected


# What a missing or altered key revocation trigger costs (delivery.api.auth): each API process
# caches a key's lookup for the auth cache's TTL, and only this trigger's NOTIFY drops a revoked
# key from the caches of processes other than the one that revoked it.
_KEY_REVOKED_COST = (
    "a revocation may not reach the API processes' auth caches, so a revoked API key can keep working for up to"
    " the cache's TTL (HOOKLEDGER_AUTH_CACHE_TTL_MS, 30 s by default) in every API process that has it cached"
    " (every process but the one that served its DELETE /v1/api-keys; every process for a revocation by an account"
    " deletion or by hand) instead of stopping when the revocation commits; the ledger is unaffected"
)


def _expected_guard_triggers() -> list[_ExpectedTrigger]:
    """The guard triggers, reported as notices: the key revocation trigger of billing.tables (0004),
    which the migration leaves plain ENABLE (it NOTIFYs; nothing about money rests on it)."""
    statements = (tables.KEY_REVOKED_FUNCTION, tables.KEY_REVOKED_TRIGGER)
    create = _TRIGGER_DEFINITION.fullmatch(tables.KEY_REVOKED_TRIGGER)
    return _triggers_created_by(statements, [(NOTICE, create["table"], create["name"])], _KEY_REVOKED_COST)


@dataclass(frozen=True)
class _ExpectedSettings:
    """A function's settings (pg_proc.proconfig) as the migrations leave them, and their statements."""

    function: str  # as regprocedure prints it: name(argument types)
    settings: tuple[tuple[str, str], ...]  # (name, value)
    statements: tuple[str, ...]


_ALTER_FUNCTION_SET = re.compile(
    r"\s*ALTER FUNCTION (?P<function>\w+\([^)]*\)) SET (?P<name>\w+) (?:=|TO) (?P<value>.+?)\s*", re.I)


def _expected_settings() -> list[_ExpectedSettings]:
    """The probe setting: every reference check function runs with sequential scans off, from the
    very statements migration 0006 runs (billing.references.probe_setting_statements)."""
    by_function: dict[str, list[tuple[str, str, str]]] = {}
    for statement in references.probe_setting_statements():
        match = _ALTER_FUNCTION_SET.fullmatch(statement)
        assert match is not None, statement
        by_function.setdefault(match["function"], []).append(
            (match["name"].lower(), match["value"].strip("'"), statement))
    return [_ExpectedSettings(function, tuple((name, value) for name, value, _ in sets),
                              tuple(statement for _, _, statement in sets))
            for function, sets in by_function.items()]


_EXPECTED_TRIGGERS = _expected_triggers()
_EXPECTED_GUARD_TRIGGERS = _expected_guard_triggers()
_EXPECTED_SETTINGS = _expected_settings()


def _digest(text: str | None) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12] if text is not None else "none"


def _trigger_problems(expected: _ExpectedTrigger, row, functions_seen: set) -> list[str]:
    """What is wrong with one trigger: it is missing; it fires in fewer cases than the migrations
    leave it firing in; it fires on other than the migration says (events, timing, level, columns,
    WHEN, transition table, function); or its function's body is not the migration's, byte for byte
    (checked once per function). A trigger can be recreated under its name, or its function replaced
    (CREATE OR REPLACE), without its name or its enabled state showing it."""
    name = f"trigger {expected.name} on {expected.table}"
    if row["definition"] is None:
        return [f"{name} does not exist"]
    problems = []
    if not _FIRES_UNDER[row["enabled"]] >= _FIRES_UNDER[expected.enabled]:
        problems.append(f"{name} is not enabled always" if expected.enabled == "A" else
                        f"{name} is {_STATE_NAMES[row['enabled']]},"
                        f" the migrations leave it {_STATE_NAMES[expected.enabled]}")
    if _canonical_trigger(row["definition"]) != _canonical_trigger(expected.statement):
        problems.append(f"{name} is not the one the migrations create: it is `{row['definition']}`,"
                        f" expected `{expected.statement}`")
    if (expected.invariant, row["function"]) not in functions_seen:
        functions_seen.add((expected.invariant, row["function"]))
        if (row["language"], row["source"]) != (expected.language, expected.source):
            problems.append(f"function {row['function']} of {name} is not the one the migrations create:"
                            f" {row['language']} source sha256 {_digest(row['source'])}, expected {expected.language}"
                            f" source sha256 {_digest(expected.source)}")
    return problems


def _setting_value(value: str) -> str:
    """A setting's value as PostgreSQL reads a boolean (on, true, yes, 1 and their unique prefixes
    are all on), so `SET enable_seqscan = false` is the migration's `off`; any other value as it is."""
    word = value.strip().strip("'").lower()
    if word and ("true".startswith(word) or "yes".startswith(word) or word == "1"
                 or (len(word) >= 2 and "on".startswith(word))):
        return "on"
    if word and ("false".startswith(word) or "no".startswith(word) or word == "0"
                 or (len(word) >= 2 and "off".startswith(word))):
        return "off"
    return word


def _settings_problem(expected: _ExpectedSettings, row) -> str | None:
    """What is wrong with a function's settings: not exactly the migrations' (a setting missing or
    set otherwise, or one they do not give it). A missing function is not reported here: its trigger
    is then gone or calls another function, which I8 reports."""
    if row["function"] is None:
        return None
    config = row["config"] or []
    actual = {name.lower(): value for name, _, value in (setting.partition("=") for setting in config)}
    wanted = dict(expected.settings)
    unmet = [name for name, value in wanted.items()
             if name not in actual or _setting_value(actual[name]) != _setting_value(value)]
    extra = [name for name in actual if name not in wanted]
    if not unmet and not extra:
        return None
    has = ", ".join(config) if config else "no settings"
    gives = ", ".join(f"{name}={value}" for name, value in expected.settings)
    if unmet:
        cost = ("its reference probes are no longer pinned to index probes (a probe planned while its parent table"
                " looked small becomes a sequential scan of it, and a create then costs time in proportion to every"
                " message ever written); the ledger stays right; put it back with "
                + "; ".join(f"`{statement}`" for statement in expected.statements))
    else:
        cost = (f"{', '.join(extra)} may change the plans of its reference probes, which the migrations pin to"
                f" index probes; the ledger stays right")
    return f"function {row['function']} runs with {has}, the migrations give it {gives}: {cost}"


async def _catalog_findings(connection) -> tuple[list[Violation], list[Violation]]:
    """I5 and I8 (violations) and the guards (notices), from one read of the catalog."""
    triggers = (*_EXPECTED_TRIGGERS, *_EXPECTED_GUARD_TRIGGERS)
    rows = await connection.fetch(_CATALOG, [t.table for t in triggers], [t.name for t in triggers],
                                  [s.function for s in _EXPECTED_SETTINGS])
    found = {(row["table_name"], row["name"]): row for row in rows if row["kind"] == "trigger"}
    functions = {row["name"]: row for row in rows if row["kind"] == "function"}
    violations, notices, functions_seen = [], [], set()
    for expected in triggers:
        for problem in _trigger_problems(expected, found[expected.table, expected.name], functions_seen):
            if expected.invariant == NOTICE:
                notices.append(Violation(NOTICE, None, None, f"{problem}: {expected.cost}"))
            else:
                violations.append(Violation(expected.invariant, None, None, problem))
    for expected in _EXPECTED_SETTINGS:
        if problem := _settings_problem(expected, functions[expected.function]):
            notices.append(Violation(NOTICE, None, None, problem))
    return violations, notices


# Operational deliveries: how many (counted apart), and any ledger entry naming one (never charged).
_OPERATIONAL_COUNT = "SELECT count(*) FROM operational_deliveries WHERE $1::uuid IS NULL OR account_id = $1"
_OPERATIONAL_CHARGED = (
    "SELECT o.account_id, o.id AS delivery_id,"
    "   'I1:an operational delivery has ledger entry ' || l.id || ' (they are never charged)' AS problem"
    " FROM operational_deliveries o JOIN ledger_entries l ON l.delivery_id = o.id"
    " WHERE $1::uuid IS NULL OR o.account_id = $1"
)


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
        catalog_violations, catalog_notices = await _catalog_findings(connection)
        report.violations.extend(catalog_violations)
        report.notices.extend(catalog_notices)
        for query in (_scoped(_FENCING_CHECK, since), _scoped(_ENTRY_ACCOUNT_CHECK, since), negative_charge,
                      _scoped(_UNRECLAIMED_LATE_SUCCESS, since)):
            report.violations.extend(_violation(row) for row in await connection.fetch(query, *arguments))
        report.notices.extend(
            Violation(NOTICE, row["account_id"], row["delivery_id"], row["problem"])
            for row in await connection.fetch(_scoped(_UNPAID_STALE_SUCCESS, since), *arguments)
        )
        report.violations.extend(_violation(row) for row in await connection.fetch(_OPERATIONAL_CHARGED, account_id))
        report.operational_deliveries = await connection.fetchval(_OPERATIONAL_COUNT, account_id)
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
