"""An application's usage: what its deliveries moved on the ledger, summed from the entries.

Money stays per account; an application has no balance of its own. Its usage is a sum over the
ledger entries of the deliveries to its endpoints (every endpoint it ever had, deleted ones too),
the very entries the audit proves (I1-I3): a charge per delivery, at most one refund when it
died, at most one reclaim when a dead one turned out delivered. A delivery belongs to one
application (billing.references checks that its message and endpoint share it), so the usages of
an account's applications add up to its delivery entries.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

from billing.database import Executor


@dataclass(frozen=True)
class Usage:
    charges: int  # entries
    charged: int  # credits, positive
    refunds: int
    refunded: int
    reclaims: int
    reclaimed: int

    @property
    def net(self) -> int:
        """Credits the account paid for the application's deliveries in the period."""
        return self.charged - self.refunded + self.reclaimed


# The application's endpoints by ix_endpoints_application_id_account_id, their deliveries by
# (endpoint_id, state), their entries by the delivery_id index; the period on the entries' time,
# [since, until), either end open when NULL.
_USAGE = (
    "SELECT count(*) FILTER (WHERE l.kind = 'charge') AS charges,"
    "   coalesce(-sum(l.amount) FILTER (WHERE l.kind = 'charge'), 0) AS charged,"
    "   count(*) FILTER (WHERE l.kind = 'refund') AS refunds,"
    "   coalesce(sum(l.amount) FILTER (WHERE l.kind = 'refund'), 0) AS refunded,"
    "   count(*) FILTER (WHERE l.kind = 'reclaim') AS reclaims,"
    "   coalesce(-sum(l.amount) FILTER (WHERE l.kind = 'reclaim'), 0) AS reclaimed"
    " FROM endpoints e"
    " JOIN deliveries d ON d.endpoint_id = e.id AND d.account_id = e.account_id"
    " JOIN ledger_entries l ON l.delivery_id = d.id AND l.account_id = d.account_id"
    " WHERE e.application_id = $1 AND e.account_id = $2"
    "   AND l.created_at >= coalesce($3::timestamptz, '-infinity') AND l.created_at < coalesce($4::timestamptz, 'infinity')"
)


# The same sums for several applications of the account at once (a page of them), by application.
_USAGE_BY_APPLICATION = (
    _USAGE.replace("SELECT count(*)", "SELECT e.application_id, count(*)", 1)
    .replace("WHERE e.application_id = $1", "WHERE e.application_id = ANY($1::uuid[])") + " GROUP BY e.application_id"
)


async def usage_by_application(executor: Executor, account_id: uuid.UUID, application_ids: list[uuid.UUID],
                               since: datetime | None = None) -> dict[uuid.UUID, Usage]:
    """Each application's usage since `since` (every one of `application_ids`, zero when it has none)."""
    rows = await executor.fetch(_USAGE_BY_APPLICATION, application_ids, account_id, since, None)
    found = {row["application_id"]: Usage(**{name: int(row[name]) for name in Usage.__dataclass_fields__})
             for row in rows}
    return {application_id: found.get(application_id, Usage(0, 0, 0, 0, 0, 0)) for application_id in application_ids}


async def application_usage(executor: Executor, account_id: uuid.UUID, application_id: uuid.UUID,
                            since: datetime | None = None, until: datetime | None = None) -> Usage:
    row = await executor.fetchrow(_USAGE, application_id, account_id, since, until)
    return Usage(**{name: int(row[name]) for name in Usage.__dataclass_fields__})
