"""Table definitions (SQLAlchemy Core): the one description of the schema.

The migrations create exactly these tables, and a test compares `alembic upgrade head` with
them. Runtime code does not use SQLAlchemy; it sends its own statements (in `billing` and
`delivery`'s query modules) through asyncpg. Every text column has a length CHECK,
every money column is a bigint number of credits, and every table carries `account_id`, so
the data can be distributed by account when one server is outgrown.

messages, deliveries, ledger_entries and delivery_attempts declare no foreign keys: their
references are checked once per INSERT statement by triggers (billing.references), which also
check that a child's account is its parent's, and the rows they point at are never deleted.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg

metadata = sa.MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s",
        "pk": "pk_%(table_name)s",
    }
)

ACCOUNT_STATUSES = ("active", "closing", "deleted")
DELIVERY_STATES = ("pending", "sending", "delivered", "dead")
LIVE_STATES = ("pending", "sending")
DEAD_REASONS = (
    "out_of_retries",
    "endpoint_deleted",
    "account_closed",
    "endpoint_disabled",
    "attempts_exhausted",
    "account_deleted",
)
SIGNING_KEY_TYPES = ("hmac", "ed25519")
# Bounds on endpoints.rate_limit_per_second (requests per second, every worker together).
RATE_LIMIT_PER_SECOND_MIN = 1
RATE_LIMIT_PER_SECOND_MAX = 10_000
LEDGER_KINDS = (
    "charge",
    "refund",
    "reclaim",
    "topup",
    "topup_reversal",
    "closeout",
    "adjustment",
)


# Days a finished message's payload and response excerpts are kept (accounts.payload_retention_days).
PAYLOAD_RETENTION_DAYS_DEFAULT = 30
PAYLOAD_RETENTION_DAYS_MIN = 1
PAYLOAD_RETENTION_DAYS_MAX = 3_650
ERASED_BY_LENGTH_MAX = 100
PORTAL_FRAME_ANCESTORS_MAX = 10  # origins an account lets embed its customer portal in an iframe


def _in(column: str, values: tuple[str, ...]) -> str:
    quoted = ", ".join(f"'{value}'" for value in values)
    return f"{column} IN ({quoted})"


TRACE_CONTEXT_LENGTH_MAX = 128  # a traceparent is 55 characters; a later version may be longer


def _length(column: str, low: int, high: int) -> str:
    return f"char_length({column}) BETWEEN {low} AND {high}"


def _created_at() -> sa.Column:
    return sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now())


accounts = sa.Table(
    "accounts",
    metadata,
    sa.Column("id", pg.UUID(as_uuid=True), primary_key=True),
    sa.Column("name", sa.Text, nullable=False),
    sa.Column("status", sa.Text, nullable=False, server_default="active"),
    sa.Column("balance", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("price_per_delivery", sa.BigInteger, nullable=False, server_default="1"),
    _created_at(),
    sa.Column("deleted_at", sa.DateTime(timezone=True)),
    # How long a message's payload and its attempts' response excerpts are kept once its
    # deliveries have finished (delivery.operations.retention); the operator sets it (0014).
    sa.Column("payload_retention_days", sa.Integer, nullable=False,
              server_default=str(PAYLOAD_RETENTION_DAYS_DEFAULT)),
    # Operational events about the balance (billing.operational_outbox): balance.low when the
    # balance falls below the threshold (NULL: off) while armed; a top-up above it arms it again.
    # balance.exhausted on a refused create while its flag is armed; the next accepted message arms it
    # again (the create's own write of the balance: a top-up, a reversal or a reclaim does not).
    sa.Column("low_balance_threshold", sa.BigInteger),
    sa.Column("low_balance_armed", sa.Boolean, nullable=False, server_default=sa.true()),
    sa.Column("balance_exhausted_armed", sa.Boolean, nullable=False, server_default=sa.true()),
    # The https origins allowed to embed the account's customer portal in an iframe (its CSP
    # frame-ancestors); none: the portal refuses to be framed.
    sa.Column("portal_frame_ancestors", pg.ARRAY(sa.Text), nullable=False, server_default=sa.text("'{}'::text[]")),
    sa.CheckConstraint(_length("name", 1, 200), name="name_length"),
    sa.CheckConstraint(f"cardinality(portal_frame_ancestors) <= {PORTAL_FRAME_ANCESTORS_MAX}", name="portal_frame_ancestors_max"),
    sa.CheckConstraint("low_balance_threshold IS NULL OR low_balance_threshold > 0", name="low_balance_threshold_positive"),
    sa.CheckConstraint(
        f"payload_retention_days BETWEEN {PAYLOAD_RETENTION_DAYS_MIN} AND {PAYLOAD_RETENTION_DAYS_MAX}",
        name="payload_retention_days_range",
    ),
    sa.CheckConstraint(_in("status", ACCOUNT_STATUSES), name="status"),
    sa.CheckConstraint("price_per_delivery >= 0", name="price_non_negative"),
    comment="A sender. balance is a cached sum of its ledger entries, updated in the same transaction as each entry.",
)

api_keys = sa.Table(
    "api_keys",
    metadata,
    sa.Column("id", pg.UUID(as_uuid=True), primary_key=True),
    sa.Column("account_id", pg.UUID(as_uuid=True), sa.ForeignKey("accounts.id"), nullable=False),
    sa.Column("key_hash", sa.LargeBinary, nullable=False, unique=True),
    sa.Column("prefix", sa.Text, nullable=False),
    _created_at(),
    sa.Column("revoked_at", sa.DateTime(timezone=True)),
    sa.CheckConstraint(_length("prefix", 4, 32), name="prefix_length"),
    sa.CheckConstraint("octet_length(key_hash) = 32", name="key_hash_length"),
    sa.Index(None, "account_id"),
    comment="Account API keys, stored only as SHA-256 hashes; the prefix lets a person tell keys apart.",
)

# Applications (0016): one customer of the account's app. The account pays for every delivery;
# an application groups endpoints, and a message goes to one application. An account's default
# application has the account's own id (created with the account by a trigger,
# billing.application_triggers), so the routes without an application name it without a lookup.
APPLICATION_NAME_LENGTH_MAX = 200
APPLICATION_UID_LENGTH_MAX = 256
APPLICATION_METADATA_BYTES_MAX = 16_384
APPLICATION_RATE_LIMIT_MAX = 100_000  # deliveries a second
MESSAGE_CHANNELS_MAX = 10
ENDPOINT_CHANNELS_MAX = 100
CHANNEL_LENGTH_MAX = 128
EVENT_TYPE_SCHEMA_BYTES_MAX = 65_536
EVENT_TYPE_DESCRIPTION_LENGTH_MAX = 1000
EVENT_TYPES_PER_ACCOUNT_MAX = 1000
# What a subscription "invoice.*" matches by: its prefix "invoice.". IMMUTABLE, so that a generated
# column may use it (endpoints.event_type_prefixes); NULL when no subscription is a wildcard.
EVENT_TYPE_PREFIXES_FUNCTION = """
CREATE FUNCTION event_type_prefixes(types text[]) RETURNS text[] LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT nullif(array(SELECT left(t, -1) FROM unnest(types) AS t WHERE right(t, 2) = '.*'), '{}')
$$
"""

applications = sa.Table(
    "applications",
    metadata,
    sa.Column("id", pg.UUID(as_uuid=True), nullable=False),
    sa.Column("account_id", pg.UUID(as_uuid=True), sa.ForeignKey("accounts.id"), nullable=False),
    # The account's own name for it (its customer's id in its system), unique among the
    # account's live applications; NULL for none.
    sa.Column("uid", sa.Text),
    sa.Column("name", sa.Text, nullable=False),
    sa.Column("metadata", pg.JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
    # The default rate limit of its endpoints, in deliveries a second (each endpoint on its own): an
    # endpoint without a rate_limit_per_second of its own is throttled at this; NULL for none.
    sa.Column("rate_limit_per_second", sa.Integer),
    _created_at(),
    sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
    sa.Column("deleted_at", sa.DateTime(timezone=True)),
    sa.CheckConstraint(_length("name", 1, APPLICATION_NAME_LENGTH_MAX), name="name_length"),
    sa.CheckConstraint("uid IS NULL OR " + _length("uid", 1, APPLICATION_UID_LENGTH_MAX), name="uid_length"),
    sa.CheckConstraint(f"jsonb_typeof(metadata) = 'object' AND octet_length(metadata::text) <= {APPLICATION_METADATA_BYTES_MAX}",
                       name="metadata_size"),
    sa.CheckConstraint(f"rate_limit_per_second BETWEEN 1 AND {APPLICATION_RATE_LIMIT_MAX}", name="rate_limit_range"),
    # The default application (id = account_id) is never deleted: the routes without an
    # application send to it.
    sa.CheckConstraint("deleted_at IS NULL OR id <> account_id", name="default_not_deleted"),
    # What endpoints' (account_id, application_id) refers to, and an account's pages in id order (0022).
    sa.PrimaryKeyConstraint("account_id", "id"),
    sa.Index("uq_applications_live_uid", "account_id", "uid", unique=True,
             postgresql_where=sa.text("deleted_at IS NULL AND uid IS NOT NULL")),
    comment="One customer of an account's app: its endpoints, and the messages sent to it."
            " The account pays; usage per application is a sum over the ledger.",
)

application_counts = sa.Table(
    "application_counts",
    metadata,
    sa.Column("account_id", pg.UUID(as_uuid=True), sa.ForeignKey("accounts.id"), primary_key=True),
    sa.Column("live", sa.Integer, nullable=False),
    sa.CheckConstraint("live >= 0", name="live_non_negative"),
    comment="How many live applications each account has (0016), kept by triggers on applications: what the"
            " per-account bound is checked against, in one probe however many there are.",
)

event_types = sa.Table(
    "event_types",
    metadata,
    sa.Column("id", pg.UUID(as_uuid=True), nullable=False),
    sa.Column("account_id", pg.UUID(as_uuid=True), sa.ForeignKey("accounts.id"), nullable=False),
    sa.Column("name", sa.Text, nullable=False),
    sa.Column("description", sa.Text, nullable=False, server_default=""),
    # A JSON Schema (draft 2020-12) the payload of a message of this type must pass; NULL: any payload.
    sa.Column("schema", pg.JSONB),
    sa.Column("archived", sa.Boolean, nullable=False, server_default=sa.false()),
    _created_at(),
    sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
    sa.CheckConstraint(_length("name", 1, 256), name="name_length"),
    sa.CheckConstraint(_length("description", 0, EVENT_TYPE_DESCRIPTION_LENGTH_MAX), name="description_length"),
    sa.CheckConstraint(f"jsonb_typeof(schema) IN ('object', 'boolean') AND octet_length(schema::text) <= {EVENT_TYPE_SCHEMA_BYTES_MAX}",
                       name="schema_size"),
    sa.PrimaryKeyConstraint("account_id", "id"),  # keys include the account (0022, billing.distribution)
    sa.UniqueConstraint("account_id", "name"),
    comment="An account's catalog of event types (0016): what each means and, with a schema, what its payload must be.",
)

endpoints = sa.Table(
    "endpoints",
    metadata,
    sa.Column("id", pg.UUID(as_uuid=True), nullable=False),
    sa.Column("account_id", pg.UUID(as_uuid=True), sa.ForeignKey("accounts.id"), nullable=False),
    sa.Column("url", sa.Text, nullable=False),
    sa.Column("description", sa.Text, nullable=False, server_default=""),
    sa.Column("event_types", pg.ARRAY(sa.Text)),
    sa.Column("secret", sa.LargeBinary),
    sa.Column("previous_secret", sa.LargeBinary),
    sa.Column("previous_secret_expires_at", sa.DateTime(timezone=True)),
    sa.Column("timeout_ms", sa.Integer, nullable=False, server_default="15000"),
    sa.Column("enabled", sa.Boolean, nullable=False, server_default=sa.true()),
    sa.Column("disabled_reason", sa.Text),
    _created_at(),
    sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
    sa.Column("deleted_at", sa.DateTime(timezone=True)),
    # The kind of the current key (0013): hmac, a whsec_ secret; ed25519, a whsk_ private key whose
    # whpk_ public key is what the account sees. The sealed key itself says it too; this column
    # lets a list of endpoints say it without opening every key.
    sa.Column("signing_key_type", sa.Text, nullable=False, server_default="hmac"),
    # Custom headers sent with every request (0013), a JSON object of name -> value; NULL when
    # none. Checked by delivery.store.endpoint_headers; bounded here in bytes.
    sa.Column("headers", pg.JSONB),
    # The most requests per second every worker together sends to the endpoint (0014); NULL: no
    # limit. The workers share a token bucket in Redis (delivery.engine.throttle).
    sa.Column("rate_limit_per_second", sa.Integer),
    # The application it belongs to (0016), of the same account; it never changes.
    sa.Column("application_id", pg.UUID(as_uuid=True), nullable=False),
    # The channels it takes messages of (0016); NULL: every message, with channels or without.
    sa.Column("channels", pg.ARRAY(sa.Text)),
    # The prefixes of its wildcard subscriptions ("invoice.*" -> "invoice."), derived by the
    # database from event_types (0016), so the fan-out tests a wildcard only where there is one.
    sa.Column("event_type_prefixes", pg.ARRAY(sa.Text), sa.Computed("event_type_prefixes(event_types)", persisted=True)),
    sa.CheckConstraint(f"cardinality(channels) BETWEEN 1 AND {ENDPOINT_CHANNELS_MAX}", name="channels_count"),
    sa.ForeignKeyConstraint(["account_id", "application_id"], ["applications.account_id", "applications.id"],
                            name="fk_endpoints_application"),
    sa.CheckConstraint(_length("url", 1, 2048), name="url_length"),
    sa.CheckConstraint(_length("description", 0, 1000), name="description_length"),
    sa.CheckConstraint("disabled_reason IS NULL OR " + _length("disabled_reason", 1, 500), name="disabled_reason_length"),
    sa.CheckConstraint("cardinality(event_types) BETWEEN 1 AND 100", name="event_types_count"),
    sa.CheckConstraint("timeout_ms BETWEEN 1000 AND 60000", name="timeout_range"),
    sa.CheckConstraint("octet_length(secret) <= 1024 AND octet_length(previous_secret) <= 1024", name="secret_length"),
    sa.CheckConstraint(_in("signing_key_type", SIGNING_KEY_TYPES), name="signing_key_type"),
    sa.CheckConstraint("jsonb_typeof(headers) = 'object' AND octet_length(headers::text) <= 16384",
                       name="headers_size"),
    sa.CheckConstraint(f"rate_limit_per_second BETWEEN {RATE_LIMIT_PER_SECOND_MIN} AND {RATE_LIMIT_PER_SECOND_MAX}",
                       name="rate_limit_range"),
    # Keys include the account (0022, billing.distribution); the plain index on id serves the
    # operator's switch-off of an endpoint named by its id alone (kept by 0025).
    sa.PrimaryKeyConstraint("account_id", "id"),
    sa.Index(None, "id"),
    sa.Index(None, "account_id"),
    # An application's endpoints (0016): the fan-out's probe (which skips the deleted ones), and
    # its usage, which sums over the deliveries of every endpoint it ever had.
    sa.Index(None, "application_id", "account_id"),
    comment="Where an account's webhooks go. Secrets are encrypted at rest (signing.at_rest); event_types NULL means every type.",
)

messages = sa.Table(
    "messages",
    metadata,
    sa.Column("id", pg.UUID(as_uuid=True), nullable=False),
    sa.Column("account_id", pg.UUID(as_uuid=True), nullable=False),
    sa.Column("event_type", sa.Text, nullable=False),
    sa.Column("payload", sa.LargeBinary),
    sa.Column("idempotency_key", sa.Text),
    sa.Column("request_hash", sa.LargeBinary),
    _created_at(),
    # When and by whom the payload (and its attempts' response excerpts) was erased (0014): an
    # expunge names the API key ("api_key:<id>"), the retention job "retention", a deletion
    # "account_deletion". What was erased is not kept.
    sa.Column("payload_erased_at", sa.DateTime(timezone=True)),
    sa.Column("payload_erased_by", sa.Text),
    # The W3C traceparent of the request that created it, when tracing is on (delivery.tracing):
    # each attempt of its deliveries joins that trace (0017).
    sa.Column("trace_context", sa.Text),
    # The application it was sent to (0016), of the same account (checked by billing.references);
    # its deliveries go only to that application's endpoints.
    sa.Column("application_id", pg.UUID(as_uuid=True), nullable=False),
    # Up to MESSAGE_CHANNELS_MAX channels (0016): only endpoints that filter on none, or on one of
    # these, receive it. NULL: none.
    sa.Column("channels", pg.ARRAY(sa.Text)),
    sa.CheckConstraint(f"cardinality(channels) BETWEEN 1 AND {MESSAGE_CHANNELS_MAX}", name="channels_count"),
    sa.CheckConstraint(_length("event_type", 1, 256), name="event_type_length"),
    sa.CheckConstraint("trace_context IS NULL OR " + _length("trace_context", 1, TRACE_CONTEXT_LENGTH_MAX),
                       name="trace_context_length"),
    sa.CheckConstraint(
        "payload_erased_by IS NULL OR " + _length("payload_erased_by", 1, ERASED_BY_LENGTH_MAX),
        name="payload_erased_by_length",
    ),
    sa.CheckConstraint("payload_erased_at IS NULL OR payload IS NULL", name="erased_payload_is_null"),
    sa.CheckConstraint("idempotency_key IS NULL OR " + _length("idempotency_key", 1, 255), name="idempotency_key_length"),
    sa.CheckConstraint("octet_length(payload) <= 1048576", name="payload_size"),
    # Keys include the account (0022, billing.distribution); every read names it (0025).
    sa.PrimaryKeyConstraint("account_id", "id"),
    # The keys given (0025): a message without one writes nothing here, and no index but the
    # primary key leads with the account and can serve a probe by (account_id, id).
    sa.Index("uq_messages_account_id_idempotency_key", "account_id", "idempotency_key", unique=True,
             postgresql_where=sa.text("idempotency_key IS NOT NULL")),
    # The payloads still kept, by account and age: what the retention job walks (0014).
    sa.Index("ix_messages_retained", "account_id", "created_at", postgresql_where=sa.text("payload IS NOT NULL")),
    comment="An event an app enqueued. payload is the exact body bytes sent; erased (NULL) by an expunge,"
            " by retention once its deliveries finished, or when the account is deleted.",
)

deliveries = sa.Table(
    "deliveries",
    metadata,
    sa.Column("id", pg.UUID(as_uuid=True), nullable=False),
    sa.Column("account_id", pg.UUID(as_uuid=True), nullable=False),
    sa.Column("message_id", pg.UUID(as_uuid=True), nullable=False),
    sa.Column("endpoint_id", pg.UUID(as_uuid=True), nullable=False),
    sa.Column("price", sa.BigInteger, nullable=False),
    sa.Column("state", sa.Text, nullable=False, server_default="pending"),
    sa.Column("attempt", sa.Integer, nullable=False, server_default="0"),
    sa.Column("attempts_max", sa.Integer, nullable=False),
    sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
    sa.Column("leased_until", sa.DateTime(timezone=True)),
    sa.Column("dead_reason", sa.Text),
    _created_at(),
    sa.Column("finished_at", sa.DateTime(timezone=True)),
    # The delivery this one sends again (a replay, single or bulk; 0010), NULL for any other. Not
    # checked by billing.references: only the create path writes it, from a delivery it read in
    # the same account, and nothing changes it after.
    sa.Column("replay_of", pg.UUID(as_uuid=True)),
    # A replay's webhook-id (0013): the id the delivery it replays was sent under, so that a
    # receiver deduplicating on webhook-id knows the replay for the same webhook. NULL on every
    # other delivery, whose webhook-id is its own id. Set once, by the create path, from a delivery
    # of the same account; nothing changes it after.
    sa.Column("webhook_id", pg.UUID(as_uuid=True)),
    sa.CheckConstraint("price >= 0", name="price_non_negative"),
    sa.CheckConstraint(_in("state", DELIVERY_STATES), name="state"),
    sa.CheckConstraint("dead_reason IS NULL OR " + _in("dead_reason", DEAD_REASONS), name="dead_reason"),
    sa.CheckConstraint("(state = 'dead') = (dead_reason IS NOT NULL) OR state = 'delivered'", name="dead_has_reason"),
    sa.CheckConstraint("attempt >= 0 AND attempt <= attempts_max", name="attempt_range"),
    sa.CheckConstraint("attempts_max BETWEEN 1 AND 50", name="attempts_max_range"),
    sa.CheckConstraint("(state = 'sending') = (leased_until IS NOT NULL)", name="lease_only_when_sending"),
    sa.Index("ix_deliveries_due", "next_attempt_at", postgresql_where=sa.text("state = 'pending'")),
    sa.Index("ix_deliveries_lease", "leased_until", postgresql_where=sa.text("state = 'sending'")),
    sa.Index("ix_deliveries_account_live", "account_id", "id", postgresql_where=sa.text("state IN ('pending', 'sending')")),
    sa.Index(None, "account_id", "created_at"),
    # Keys include the account (0022, billing.distribution); every read names it. An account's
    # pages of deliveries, newest first (0009), walk the primary key. The plain index on id keeps
    # the trigger functions' probes by (account_id, id) off the account's other indexes (kept by 0025).
    sa.PrimaryKeyConstraint("account_id", "id"),
    sa.Index(None, "id"),
    # Whether a dead delivery was replayed, for the recovery's and the bulk replay's candidates (0010).
    sa.Index("ix_deliveries_replay_of", "replay_of", postgresql_where=sa.text("replay_of IS NOT NULL")),
    # The dead deliveries in id order, for the operator's pages of them, newest first (0010).
    # Beside it, not declarable here: extended statistics on (state, dead_reason), which are set
    # together, so that a page filtered by reason is estimated as what it is (0010).
    sa.Index("ix_deliveries_dead", "id", postgresql_where=sa.text("state = 'dead'")),
    # An account's dead deliveries in id order, for its pages of them (0011).
    sa.Index("ix_deliveries_account_dead", "account_id", "id", postgresql_where=sa.text("state = 'dead'")),
    sa.Index(None, "message_id"),
    sa.Index(None, "endpoint_id", "state"),
    comment="One message to one endpoint. Charged when created; ends delivered or dead (refunded once by billing.settle).",
)

delivery_attempts = sa.Table(
    "delivery_attempts",
    metadata,
    sa.Column("delivery_id", pg.UUID(as_uuid=True), nullable=False),
    sa.Column("attempt", sa.Integer, nullable=False),
    sa.Column("account_id", pg.UUID(as_uuid=True), nullable=False),
    sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("finished_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
    sa.Column("status_code", sa.Integer),
    sa.Column("latency_ms", sa.Integer),
    sa.Column("error", sa.Text),
    sa.Column("response_excerpt", sa.Text),
    sa.Column("stale", sa.Boolean, nullable=False, server_default=sa.false()),
    # The endpoint's custom headers as this attempt sent them (0021), a JSON object of name -> value;
    # NULL when it had none. The customer's values: erased with the response excerpt.
    sa.Column("sent_headers", pg.JSONB),
    sa.CheckConstraint("attempt >= 1", name="attempt_positive"),
    sa.CheckConstraint("status_code IS NULL OR status_code BETWEEN 100 AND 599", name="status_code_range"),
    sa.CheckConstraint("error IS NULL OR " + _length("error", 1, 1000), name="error_length"),
    sa.CheckConstraint("response_excerpt IS NULL OR char_length(response_excerpt) <= 4096", name="excerpt_length"),
    sa.CheckConstraint("sent_headers IS NULL OR (jsonb_typeof(sent_headers) = 'object'"
                       " AND octet_length(sent_headers::text) <= 16384)", name="sent_headers_size"),
    sa.CheckConstraint("latency_ms IS NULL OR latency_ms >= 0", name="latency_non_negative"),
    # Keys include the account (0022, billing.distribution); every read names it (0025).
    sa.PrimaryKeyConstraint("account_id", "delivery_id", "attempt"),
    sa.Index(None, "account_id", "finished_at"),
    # The late 2xx answers, for the sweep that reclaims a refund whose reclaim was lost (0007).
    sa.Index("ix_delivery_attempts_late_success", "finished_at",
             postgresql_where=sa.text("stale AND status_code BETWEEN 200 AND 299")),
    comment="What each send did. stale marks a result that arrived after its attempt was fenced off.",
)

ledger_entries = sa.Table(
    "ledger_entries",
    metadata,
    sa.Column("id", sa.Text, nullable=False),
    # An identity: unique without a constraint (a unique key would have to include the account, 0022).
    sa.Column("seq", sa.BigInteger, sa.Identity(always=True), nullable=False),
    sa.Column("account_id", pg.UUID(as_uuid=True), nullable=False),
    sa.Column("delivery_id", pg.UUID(as_uuid=True)),
    sa.Column("kind", sa.Text, nullable=False),
    sa.Column("amount", sa.BigInteger, nullable=False),
    sa.Column("note", sa.Text),
    _created_at(),
    sa.CheckConstraint(_in("kind", LEDGER_KINDS), name="kind"),
    sa.CheckConstraint(_length("id", 3, 300), name="id_length"),
    sa.CheckConstraint("note IS NULL OR " + _length("note", 1, 1000), name="note_length"),
    # Ids are derived, never random: the id says what the entry is for, so a second write of
    # the same fact collides on the primary key instead of adding money.
    sa.CheckConstraint(
        "(kind IN ('charge', 'refund', 'reclaim')) = (delivery_id IS NOT NULL)"
        " AND (delivery_id IS NULL OR id = kind || ':' || delivery_id::text)",
        name="delivery_entry_id",
    ),
    sa.CheckConstraint(
        "kind NOT IN ('topup', 'topup_reversal', 'closeout') OR id LIKE kind || ':%'",
        name="derived_id",
    ),
    sa.CheckConstraint(
        "CASE kind WHEN 'charge' THEN amount <= 0 WHEN 'reclaim' THEN amount <= 0"
        " WHEN 'refund' THEN amount >= 0 WHEN 'topup' THEN amount > 0"
        " WHEN 'topup_reversal' THEN amount < 0 ELSE true END",
        name="amount_sign",
    ),
    # Keys include the account (0022, billing.distribution): derived ids are unique together with it.
    # The plain index on seq serves reads of the whole ledger in seq order; the top-ups' ids, an
    # order's top-up on any account (billing.accounts.top_up; 0025: not every entry's id).
    sa.PrimaryKeyConstraint("account_id", "id"),
    sa.Index("ix_ledger_entries_topup_id", "id", postgresql_where=sa.text("kind = 'topup'")),
    sa.Index(None, "seq"),
    sa.Index(None, "account_id", "seq"),
    sa.Index(None, "delivery_id", postgresql_where=sa.text("delivery_id IS NOT NULL")),
    comment="Append-only ledger. Every credit moves through here; a trigger refuses UPDATE, DELETE and TRUNCATE.",
)

APPEND_ONLY_FUNCTION = """
CREATE FUNCTION ledger_entries_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'ledger_entries is append-only: % refused', TG_OP
        USING ERRCODE = 'raise_exception', HINT = 'correct a mistake with an adjustment entry';
END;
$$
"""
APPEND_ONLY_TRIGGERS = (
    "CREATE TRIGGER ledger_entries_no_update_delete BEFORE UPDATE OR DELETE ON ledger_entries"
    " FOR EACH ROW EXECUTE FUNCTION ledger_entries_append_only()",
    "CREATE TRIGGER ledger_entries_no_truncate BEFORE TRUNCATE ON ledger_entries"
    " FOR EACH STATEMENT EXECUTE FUNCTION ledger_entries_append_only()",
)
# ALWAYS: the triggers fire even under session_replication_role = replica, which a superuser
# could otherwise set to skip ordinary triggers.
APPEND_ONLY_ENABLE_ALWAYS = (
    "ALTER TABLE ledger_entries ENABLE ALWAYS TRIGGER ledger_entries_no_update_delete",
    "ALTER TABLE ledger_entries ENABLE ALWAYS TRIGGER ledger_entries_no_truncate",
)

# Every API process caches key lookups (delivery.api.auth); a revocation, from any path (the API,
# the dashboard, an account's closeout, a person in psql), tells all of them at commit through
# this channel. The payload is the key's hash in hex.
KEY_REVOKED_CHANNEL = "hookledger_api_key_revoked"
KEY_REVOKED_FUNCTION = f"""
CREATE FUNCTION api_keys_notify_revoked() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.revoked_at IS NOT NULL AND OLD.revoked_at IS NULL THEN
        PERFORM pg_notify('{KEY_REVOKED_CHANNEL}', encode(NEW.key_hash, 'hex'));
    END IF;
    RETURN NULL;
END;
$$
"""
KEY_REVOKED_TRIGGER = (
    "CREATE TRIGGER api_keys_revoked AFTER UPDATE OF revoked_at ON api_keys"
    " FOR EACH ROW EXECUTE FUNCTION api_keys_notify_revoked()"
)

DELETION_STATUSES = ("running", "waiting_repair", "done", "failed")
DELETION_STEPS = ("queued", "begin_closing", "bulk_settle", "close_out", "report")

account_deletions = sa.Table(
    "account_deletions",
    metadata,
    sa.Column("id", pg.UUID(as_uuid=True), nullable=False),
    sa.Column("account_id", pg.UUID(as_uuid=True), sa.ForeignKey("accounts.id"), nullable=False, unique=True),
    sa.Column("status", sa.Text, nullable=False, server_default="running"),
    sa.Column("step", sa.Text, nullable=False, server_default="queued"),
    sa.Column("started_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
    sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
    sa.Column("finished_at", sa.DateTime(timezone=True)),
    sa.Column("report", pg.JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
    sa.CheckConstraint(_in("status", DELETION_STATUSES), name="status"),
    sa.CheckConstraint(_in("step", DELETION_STEPS), name="step"),
    sa.CheckConstraint("octet_length(report::text) <= 1048576", name="report_size"),
    sa.PrimaryKeyConstraint("account_id", "id"),  # keys include the account (0022, billing.distribution)
    comment="One deletion job per account (a second request shares the row): its progress, status and report.",
)

DASHBOARD_ROLES = ("account", "operator")

dashboard_sessions = sa.Table(
    "dashboard_sessions",
    metadata,
    sa.Column("token_hash", sa.LargeBinary, primary_key=True),
    sa.Column("role", sa.Text, nullable=False),
    sa.Column("account_id", pg.UUID(as_uuid=True), sa.ForeignKey("accounts.id")),
    sa.Column("api_key_id", pg.UUID(as_uuid=True), sa.ForeignKey("api_keys.id")),
    _created_at(),
    sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
    sa.CheckConstraint("octet_length(token_hash) = 32", name="token_hash_length"),
    sa.CheckConstraint(_in("role", DASHBOARD_ROLES), name="role"),
    # An account session names the key it signed in with (revoking the key ends the session);
    # an operator session names neither.
    sa.CheckConstraint(
        "(role = 'account') = (account_id IS NOT NULL) AND (account_id IS NULL) = (api_key_id IS NULL)",
        name="role_identity",
    ),
    sa.CheckConstraint("expires_at > created_at", name="expires_after_created"),
    sa.Index(None, "account_id"),
    sa.Index(None, "expires_at"),
    comment="Web dashboard sign-ins. Only a SHA-256 hash of the session token is kept; the token lives in the browser's cookie.",
)

PORTAL_LINK_SECONDS = 15 * 60  # a magic link signs in within this
PORTAL_SESSION_SECONDS = 8 * 3600  # and the session it opens lasts at most this

portal_links = sa.Table(
    "portal_links",
    metadata,
    sa.Column("token_hash", sa.LargeBinary, primary_key=True),
    sa.Column("account_id", pg.UUID(as_uuid=True), nullable=False),
    sa.Column("application_id", pg.UUID(as_uuid=True), nullable=False),
    _created_at(),
    sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("used_at", sa.DateTime(timezone=True)),
    sa.CheckConstraint("octet_length(token_hash) = 32", name="token_hash_length"),
    sa.CheckConstraint("expires_at > created_at", name="expires_after_created"),
    sa.ForeignKeyConstraint(["account_id", "application_id"], ["applications.account_id", "applications.id"],
                            name="fk_portal_links_application"),
    sa.Index(None, "expires_at"),
    comment="Single-use magic links into an application's portal (0016); only the token's SHA-256 is kept.",
)

portal_sessions = sa.Table(
    "portal_sessions",
    metadata,
    sa.Column("token_hash", sa.LargeBinary, primary_key=True),
    sa.Column("account_id", pg.UUID(as_uuid=True), nullable=False),
    sa.Column("application_id", pg.UUID(as_uuid=True), nullable=False),
    _created_at(),
    sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
    sa.CheckConstraint("octet_length(token_hash) = 32", name="token_hash_length"),
    sa.CheckConstraint("expires_at > created_at", name="expires_after_created"),
    sa.ForeignKeyConstraint(["account_id", "application_id"], ["applications.account_id", "applications.id"],
                            name="fk_portal_sessions_application"),
    sa.Index(None, "expires_at"),
    comment="Portal sign-ins (0016): one application's customer, for at most 8 hours; only the token's SHA-256 is kept.",
)

idempotent_responses = sa.Table(
    "idempotent_responses",
    metadata,
    # Whose key it is: an account's id (as text) for an account's creates, "operator" for the operator's.
    sa.Column("principal", sa.Text, primary_key=True),
    sa.Column("key", sa.Text, primary_key=True),
    sa.Column("fingerprint", sa.LargeBinary, nullable=False),
    sa.Column("status", sa.SmallInteger, nullable=False),
    sa.Column("body", sa.LargeBinary, nullable=False),
    _created_at(),
    sa.CheckConstraint(_length("principal", 1, 64), name="principal_length"),
    sa.CheckConstraint(_length("key", 1, 255), name="key_length"),
    sa.CheckConstraint("octet_length(fingerprint) = 32", name="fingerprint_length"),
    # Only answers that made something are kept: a refused request leaves no row, so its corrected
    # retry with the same key goes ahead.
    sa.CheckConstraint("status BETWEEN 200 AND 299", name="status_success"),
    sa.CheckConstraint("octet_length(body) <= 262144", name="body_size"),
    sa.Index(None, "created_at"),
    comment="The 2xx answer of a keyed create other than a message (account, API key, endpoint, secret rotation),"
            " sealed at rest: a retry with the same Idempotency-Key gets it again. Purged after 25 h.",
)


OPERATIONAL_EVENT_TYPES = (
    "endpoint.disabled",
    "endpoint.enabled",
    "endpoint.failing",
    "delivery.dead",
    "delivery.recovered",
    "balance.low",
    "balance.exhausted",
    "topup.applied",
    "topup.reversed",
)
OPERATIONAL_DEAD_BATCH_MAX = 100  # dead deliveries of one endpoint that one delivery.dead event carries
OPERATIONAL_STATES = DELIVERY_STATES
OPERATIONAL_DEAD_REASONS = ("out_of_retries", "endpoint_disabled", "endpoint_deleted", "attempts_exhausted",
                            "account_closed")

operational_endpoints = sa.Table(
    "operational_endpoints",
    metadata,
    sa.Column("id", pg.UUID(as_uuid=True), nullable=False),
    sa.Column("account_id", pg.UUID(as_uuid=True), sa.ForeignKey("accounts.id"), nullable=False),
    sa.Column("url", sa.Text, nullable=False),
    sa.Column("description", sa.Text, nullable=False, server_default=""),
    sa.Column("event_types", pg.ARRAY(sa.Text)),
    sa.Column("secret", sa.LargeBinary),  # NULL once the account is deleted (billing.closeout erases it)
    sa.Column("enabled", sa.Boolean, nullable=False, server_default=sa.true()),
    _created_at(),
    sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
    sa.Column("deleted_at", sa.DateTime(timezone=True)),
    # Why the worker switched it off (delivery.operations.operational_health): 'gone' (410) or
    # 'failing' (the auto-disable policy); NULL while enabled or when its account switched it off.
    sa.Column("disabled_reason", sa.Text),
    # Its current failure streak (cleared by a success), measured against the auto-disable policy.
    sa.Column("failing_since", sa.DateTime(timezone=True)),
    sa.Column("last_failure_at", sa.DateTime(timezone=True)),
    sa.Column("failure_count", sa.Integer, nullable=False, server_default="0"),
    sa.CheckConstraint(_length("url", 1, 2048), name="url_length"),
    sa.CheckConstraint(_length("description", 0, 1000), name="description_length"),
    sa.CheckConstraint(f"cardinality(event_types) BETWEEN 1 AND {len(OPERATIONAL_EVENT_TYPES)}",
                       name="event_types_count"),
    sa.CheckConstraint("octet_length(secret) <= 1024", name="secret_length"),
    sa.CheckConstraint("disabled_reason IS NULL OR char_length(disabled_reason) BETWEEN 1 AND 500",
                       name="disabled_reason_length"),
    sa.CheckConstraint("failure_count >= 0", name="failure_count_positive"),
    # Keys include the account (0022, billing.distribution).
    sa.PrimaryKeyConstraint("account_id", "id"),
    sa.Index(None, "account_id"),
    comment="Where an account's operational events go (its own whsec_ secret, encrypted at rest). Free of charge;"
            " event_types NULL means every type.",
)

operational_events = sa.Table(
    "operational_events",
    metadata,
    sa.Column("id", pg.UUID(as_uuid=True), nullable=False),
    # An identity: unique without a constraint (a unique key would have to include the account, 0022).
    sa.Column("seq", sa.BigInteger, sa.Identity(always=True), nullable=False),
    sa.Column("account_id", pg.UUID(as_uuid=True), nullable=False),
    sa.Column("type", sa.Text, nullable=False),
    sa.Column("data", pg.JSONB, nullable=False),
    _created_at(),
    # When the worker made its deliveries to the account's operational endpoints; NULL until then.
    sa.Column("dispatched_at", sa.DateTime(timezone=True)),
    # delivery.dead: the endpoint whose deaths the event gathers; others join it until it is dispatched or full.
    sa.Column("batch_key", sa.Text),
    sa.Column("batch_size", sa.Integer, nullable=False, server_default="1"),
    # Set where one cause may be seen twice (an endpoint's failing streak): the second write finds it.
    sa.Column("dedupe_key", sa.Text),
    sa.CheckConstraint(_in("type", OPERATIONAL_EVENT_TYPES), name="type"),
    sa.CheckConstraint("octet_length(data::text) <= 262144", name="data_size"),
    sa.CheckConstraint(f"batch_size BETWEEN 1 AND {OPERATIONAL_DEAD_BATCH_MAX}", name="batch_size_range"),
    sa.CheckConstraint("batch_key IS NULL OR " + _length("batch_key", 1, 200), name="batch_key_length"),
    sa.CheckConstraint("dedupe_key IS NULL OR " + _length("dedupe_key", 1, 300), name="dedupe_key_length"),
    # Keys include the account (0022, billing.distribution).
    sa.PrimaryKeyConstraint("account_id", "id"),
    sa.UniqueConstraint("account_id", "dedupe_key"),
    sa.Index(None, "account_id", "seq"),
    sa.Index("ix_operational_events_undispatched", "seq", postgresql_where=sa.text("dispatched_at IS NULL")),
    sa.Index("ix_operational_events_open_batch", "batch_key",
             postgresql_where=sa.text("dispatched_at IS NULL AND batch_key IS NOT NULL")),
    comment="The outbox of operational events: each written in the transaction of the change that causes it"
            " (billing.operational_outbox), never charged, never in the ledger.",
)

operational_deliveries = sa.Table(
    "operational_deliveries",
    metadata,
    sa.Column("id", pg.UUID(as_uuid=True), nullable=False),
    sa.Column("account_id", pg.UUID(as_uuid=True), nullable=False),
    sa.Column("event_id", pg.UUID(as_uuid=True), nullable=False),
    sa.Column("endpoint_id", pg.UUID(as_uuid=True), nullable=False),
    sa.Column("state", sa.Text, nullable=False, server_default="pending"),
    sa.Column("attempt", sa.Integer, nullable=False, server_default="0"),
    sa.Column("attempts_max", sa.Integer, nullable=False),
    sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
    sa.Column("leased_until", sa.DateTime(timezone=True)),
    sa.Column("last_status_code", sa.Integer),
    sa.Column("last_error", sa.Text),
    sa.Column("dead_reason", sa.Text),
    _created_at(),
    sa.Column("finished_at", sa.DateTime(timezone=True)),
    sa.CheckConstraint(_in("state", OPERATIONAL_STATES), name="state"),
    sa.CheckConstraint("dead_reason IS NULL OR " + _in("dead_reason", OPERATIONAL_DEAD_REASONS), name="dead_reason"),
    sa.CheckConstraint("(state = 'dead') = (dead_reason IS NOT NULL)", name="dead_has_reason"),
    sa.CheckConstraint("attempt >= 0 AND attempt <= attempts_max", name="attempt_range"),
    sa.CheckConstraint("attempts_max BETWEEN 1 AND 50", name="attempts_max_range"),
    sa.CheckConstraint("(state = 'sending') = (leased_until IS NOT NULL)", name="lease_only_when_sending"),
    sa.CheckConstraint("last_status_code IS NULL OR last_status_code BETWEEN 100 AND 599", name="status_code_range"),
    sa.CheckConstraint("last_error IS NULL OR " + _length("last_error", 1, 1000), name="last_error_length"),
    # Keys include the account (0022, billing.distribution).
    sa.PrimaryKeyConstraint("account_id", "id"),
    sa.ForeignKeyConstraint(["account_id", "event_id"], ["operational_events.account_id", "operational_events.id"],
                            name="fk_operational_deliveries_event_id"),
    sa.ForeignKeyConstraint(["account_id", "endpoint_id"], ["operational_endpoints.account_id", "operational_endpoints.id"],
                            name="fk_operational_deliveries_endpoint_id"),
    # One delivery per event and operational endpoint: a dispatch run twice makes nothing twice.
    sa.UniqueConstraint("account_id", "event_id", "endpoint_id"),
    sa.Index("ix_operational_deliveries_due", "next_attempt_at", postgresql_where=sa.text("state = 'pending'")),
    sa.Index("ix_operational_deliveries_lease", "leased_until", postgresql_where=sa.text("state = 'sending'")),
    sa.Index(None, "account_id"),
    comment="One operational event to one operational endpoint: signed, retried on the schedule, dead after the last"
            " attempt, free (no price, no ledger entry).",
)
