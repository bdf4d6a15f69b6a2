"""operational endpoint health: disabled on 410 Gone or a failing streak; prompt sending; balance.exhausted armed by a message

operational_endpoints gains disabled_reason (why it was switched off: 'gone', 'failing', or NULL
when its account did it) and the summary of its current failure streak (failing_since,
last_failure_at, failure_count; cleared by a success), which the operational sender keeps as it
records results and measures against the endpoints' auto-disable policy.

operational_events gains a statement trigger that notifies billing.operational_outbox.WAKE_CHANNEL,
so the worker sends events when they commit rather than at its next cron.

The trigger that armed balance.exhausted again on any debit of the balance is dropped: the create
statements arm it themselves, so only an accepted message does (a top-up reversal or a reclaim no
longer does). The downgrade restores all three as they were.

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-06
"""
import sqlalchemy as sa
from alembic import op

from billing import operational_outbox

revision = '0020'
down_revision = '0019'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("operational_endpoints", sa.Column("disabled_reason", sa.Text))
    op.add_column("operational_endpoints", sa.Column("failing_since", sa.DateTime(timezone=True)))
    op.add_column("operational_endpoints", sa.Column("last_failure_at", sa.DateTime(timezone=True)))
    op.add_column("operational_endpoints", sa.Column("failure_count", sa.Integer, nullable=False,
                                                     server_default="0"))
    op.create_check_constraint(op.f("ck_operational_endpoints_disabled_reason_length"), "operational_endpoints",
                               "disabled_reason IS NULL OR char_length(disabled_reason) BETWEEN 1 AND 500")
    op.create_check_constraint(op.f("ck_operational_endpoints_failure_count_positive"), "operational_endpoints",
                               "failure_count >= 0")
    for statement in operational_outbox.DROP_EXHAUSTED_REARM:
        op.execute(statement)
    op.execute(operational_outbox.WAKE_FUNCTION)
    op.execute(operational_outbox.WAKE_TRIGGER)


def downgrade() -> None:
    op.execute("DROP TRIGGER operational_event_written ON operational_events")
    op.execute("DROP FUNCTION operational_event_written()")
    op.execute(operational_outbox.EXHAUSTED_REARM_FUNCTION)
    op.execute(operational_outbox.EXHAUSTED_REARM_TRIGGER)
    op.drop_constraint(op.f("ck_operational_endpoints_failure_count_positive"), "operational_endpoints", type_="check")
    op.drop_constraint(op.f("ck_operational_endpoints_disabled_reason_length"), "operational_endpoints", type_="check")
    op.drop_column("operational_endpoints", "failure_count")
    op.drop_column("operational_endpoints", "last_failure_at")
    op.drop_column("operational_endpoints", "failing_since")
    op.drop_column("operational_endpoints", "disabled_reason")
