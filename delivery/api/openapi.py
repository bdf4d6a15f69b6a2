"""The OpenAPI 3.1 document, generated from the same msgspec Structs that validate and encode.

Each operation is declared once in OPERATIONS (method, path, who may call it, body, responses);
request and response schemas come from `msgspec.json.schema_components`, so what the document
says a body looks like is exactly what the decoder accepts and the encoder writes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec

from billing.messages import IDEMPOTENCY_KEY_LENGTH_MAX
from billing.tables import DEAD_REASONS, DELIVERY_STATES, OPERATIONAL_EVENT_TYPES
from delivery.api import openapi_examples as examples, responses as r, routes_recover as recover, validation as v
from delivery.api import openapi_operational, routes_operational as operational
from delivery.api import routes_applications as applications
from delivery.api import routes_event_types as event_types
from delivery.api import routes_operator_reads as operator_reads
from delivery.api.problems import ProblemBody

ACCOUNT = "account"
OPERATOR = "operator"

TAGS = {
    "Messages": "Send an event: one charged delivery per subscribed endpoint, in one transaction.",
    "Deliveries": "Each delivery of a message to an endpoint: its state, attempts, ledger entries and replays.",
    "Applications": "An account's customers: each has its own endpoints, a message goes to one, the account pays.",
    "Event types": "The event catalog: each type's description, an optional JSON Schema its payloads must pass, archived.",
    "Endpoints": "Where messages go: URL, event types, timeout, signing secret, and recovery after an outage.",
    "Billing": "The balance, the append-only ledger that proves it, and top-ups.",
    "API keys": "An account's keys; only hashes are stored, a key is shown once.",
    "Accounts": "Accounts, their settings and their deletion (the operator's; an account reads and sets its own).",
    "Operational webhooks": "Where the account's operational events go (endpoint disabled, deliveries dead, balance"
                            " low...), and the events themselves; free of charge. The payloads are under webhooks.",
    "Health": "Liveness, readiness and metrics, for load balancers and Prometheus.",
}

_UUID = {"type": "string", "format": "uuid"}
_LIMIT = {"name": "limit", "in": "query", "required": False,
          "schema": {"type": "integer", "minimum": 1, "maximum": v.PAGE_LIMIT_MAX, "default": v.PAGE_LIMIT_DEFAULT}}
_ID_CURSOR = {"name": "cursor", "in": "query", "required": False,
              "description": "next_cursor of the previous page (a delivery id).", "schema": _UUID}
_SEQ_CURSOR = {"name": "cursor", "in": "query", "required": False,
               "description": f"next_cursor of the previous page (a ledger seq, at most {v.BIGINT_MAX}).",
               "schema": {"type": "string", "pattern": f"^[0-9]{{1,{v.SEQ_CURSOR_DIGITS_MAX}}}$"}}


def _path_id(name: str = "id") -> dict:
    return {"name": name, "in": "path", "required": True, "schema": _UUID}


def _query(name: str, schema: dict, description: str = "") -> dict:
    parameter = {"name": name, "in": "query", "required": False, "schema": schema}
    if description:
        parameter["description"] = description
    return parameter


@dataclass(frozen=True)
class Operation:
    method: str
    path: str
    operation_id: str  # a verb and a noun, camelCase: what client generators name the call
    tag: str  # the resource, one of TAGS
    summary: str
    description: str
    auth: str | None
    ok: dict[int, type | None]  # success statuses and their bodies (None: no body)
    errors: tuple[int, ...] = ()
    body: type | None = None
    body_optional: bool = False
    parameters: tuple[dict, ...] = ()
    headers: dict[int, dict] = field(default_factory=dict)


_IDEMPOTENCY_KEY = {
    "name": "Idempotency-Key", "in": "header", "required": False,
    "description": ("Same key and request: the stored response again (Idempotent-Replayed: true). Another"
                    " request: 422. While the first request with the key is in progress: 409 with Retry-After."),
    "schema": {"type": "string", "minLength": 1, "maxLength": IDEMPOTENCY_KEY_LENGTH_MAX,
               "pattern": "^[\\x20-\\x7e]+$"},
}
_REPLAYED = {"Idempotent-Replayed": {"description": "true when this is a stored response for a reused key",
                                     "schema": {"type": "string", "enum": ["true"]}}}

_DATE_TIME = {"type": "string", "format": "date-time"}
_RECOVER_SINCE = {"name": "since", "in": "query", "required": True, "schema": _DATE_TIME,
                  "description": "RFC 3339 with a timezone: dead deliveries that died at or after this."}

_APP = {"name": "app", "in": "path", "required": True, "description": "The application's id or its uid.",
        "schema": {"type": "string", "minLength": 1, "maxLength": 256}}
applications_operations = (
    Operation("post", "/v1/applications", "createApplication", "Applications", "Create an application",
              f"Create an application (at most {applications.store.APPLICATIONS_PER_ACCOUNT_MAX} per account,"
              " 409 limit-reached past it; 409 uid-taken for a uid another live application has)", ACCOUNT,
              {201: applications.Application}, (409, 422), applications.ApplicationCreate,
              parameters=(_IDEMPOTENCY_KEY,), headers={201: _REPLAYED}),
    Operation("get", "/v1/applications", "listApplications", "Applications", "List applications",
              "The account's applications, oldest first (its default application first)", ACCOUNT,
              {200: applications.ApplicationPage}, (422,),
              parameters=(_LIMIT, {**_ID_CURSOR, "description": "next_cursor of the previous page (an application id)."})),
    Operation("get", "/v1/applications/{app}", "getApplication", "Applications", "Read an application",
              "Read an application by id or uid", ACCOUNT, {200: applications.Application}, (404,), parameters=(_APP,)),
    Operation("patch", "/v1/applications/{app}", "updateApplication", "Applications", "Change an application",
              "Change its name, uid, metadata or rate limit", ACCOUNT, {200: applications.Application},
              (404, 409, 422), applications.ApplicationPatch, parameters=(_APP,)),
    Operation("delete", "/v1/applications/{app}", "deleteApplication", "Applications", "Delete an application",
              "Delete an application and its endpoints; their pending deliveries are refunded. 409 for the"
              " default application", ACCOUNT, {200: applications.ApplicationDeleted}, (404, 409), parameters=(_APP,)),
    Operation("post", "/v1/applications/{app}/messages", "createApplicationMessage", "Applications",
              "Send a message to an application",
              "As POST /v1/messages, fanned out to this application's subscribed endpoints only", ACCOUNT,
              {202: r.MessageAccepted}, (402, 404, 409, 413, 422, 503), v.MessageCreate,
              parameters=(_APP, _IDEMPOTENCY_KEY), headers={202: _REPLAYED}),
    Operation("post", "/v1/applications/{app}/endpoints", "createApplicationEndpoint", "Applications",
              "Add an endpoint to an application",
              "As POST /v1/endpoints, in this application (at most"
              f" {applications.endpoint_store.ENDPOINTS_PER_APPLICATION_MAX} endpoints per application)", ACCOUNT,
              {201: r.Endpoint}, (404, 409, 422), v.EndpointCreate, parameters=(_APP, _IDEMPOTENCY_KEY),
              headers={201: _REPLAYED}),
    Operation("get", "/v1/applications/{app}/endpoints", "listApplicationEndpoints", "Applications",
              "List an application's endpoints", "The application's live endpoints, oldest first", ACCOUNT,
              {200: r.EndpointList}, (404,), parameters=(_APP,)),
    Operation("post", "/v1/applications/{app}/portal-links", "createPortalLink", "Applications",
              "Make a portal link for an application's customer",
              "A single-use magic link into /portal/, where the customer manages this application's endpoints and"
              " sees and replays its deliveries (replays are charged to the account); it signs in within 15"
              " minutes, to a session of at most 8 hours. The token is shown once", ACCOUNT,
              {201: applications.PortalLink}, (404,), v.Empty, body_optional=True, parameters=(_APP,)),
    Operation("get", "/v1/applications/{app}/usage", "getApplicationUsage", "Applications", "Read an application's usage",
              "Its charges, refunds and reclaims in [since, until), summed from the ledger entries of its deliveries"
              " (the account pays; there is no balance per application)", ACCOUNT,
              {200: applications.ApplicationUsage}, (404, 422),
              parameters=(_APP, _query("since", _DATE_TIME, "RFC 3339; absent: from the first entry."),
                          _query("until", _DATE_TIME, "RFC 3339, excluded; absent: up to now."))),
)

_NAME = {"name": "name", "in": "path", "required": True, "description": "The event type's name.",
         "schema": {"type": "string", "minLength": 1, "maxLength": 256}}
event_type_operations = (
    Operation("post", "/v1/event-types", "createEventType", "Event types", "Add an event type to the catalog",
              "A name, a description, an optional JSON Schema (draft 2020-12, checked here: 422 naming the path of"
              " what is wrong) that every payload of the type must then pass, archived. 409 for a name the account"
              " has", ACCOUNT, {201: event_types.EventTypeBody}, (409, 422), event_types.EventTypeCreate),
    Operation("get", "/v1/event-types", "listEventTypes", "Event types", "List the event catalog",
              "Oldest first; archived ones only with include_archived=true", ACCOUNT,
              {200: event_types.EventTypePage}, (422,),
              parameters=(_LIMIT, {**_ID_CURSOR, "description": "next_cursor of the previous page."},
                          _query("include_archived", {"enum": ["true", "false"]}))),
    Operation("get", "/v1/event-types/{name}", "getEventType", "Event types", "Read an event type",
              "Read an event type by name", ACCOUNT, {200: event_types.EventTypeBody}, (404,), parameters=(_NAME,)),
    Operation("patch", "/v1/event-types/{name}", "updateEventType", "Event types", "Change an event type",
              "Change its description or schema (null: none), or archive it (no new messages of it)", ACCOUNT,
              {200: event_types.EventTypeBody}, (404, 422), event_types.EventTypePatch, parameters=(_NAME,)),
)

OPERATIONS: tuple[Operation, ...] = (
    Operation("post", "/v1/accounts", "createAccount", "Accounts", "Create an account",
              "Create an account and its first API key (operator)", OPERATOR,
              {201: r.AccountCreated}, (400, 409, 422), v.AccountCreate, parameters=(_IDEMPOTENCY_KEY,),
              headers={201: _REPLAYED}),
    Operation("get", "/v1/accounts/{id}", "getAccount", "Accounts", "Read an account",
              "Read an account (operator)", OPERATOR, {200: r.Account}, (404,),
              parameters=(_path_id(),)),
    Operation("patch", "/v1/accounts/{id}", "updateAccount", "Accounts", "Change an account's settings",
              "Set payload_retention_days (how long a finished message's payload and its attempts' response"
              " excerpts are kept before the retention job erases them: 1 to 3,650 days; the ledger is kept"
              " forever) and low_balance_threshold; a field left out is unchanged (operator)", OPERATOR, {200: r.Account}, (400, 404, 422), v.AccountPatch,
              parameters=(_path_id(),)),
    Operation("delete", "/v1/accounts/{id}", "deleteAccount", "Accounts", "Delete an account",
              "Delete an account: starts the deletion job (operator)", OPERATOR,
              {202: r.AccountDeletion}, (404,), parameters=(_path_id(),)),
    Operation("get", "/v1/accounts/{id}/deletion", "getAccountDeletion", "Accounts", "Read an account's deletion",
              "The account-deletion job and its report (operator)", OPERATOR,
              {200: r.AccountDeletion}, (404,), parameters=(_path_id(),)),
    Operation("post", "/v1/accounts/{id}/topups", "createTopup", "Billing", "Top up an account",
              "Top up by order id, idempotently (operator)", OPERATOR,
              {201: r.Topup, 200: r.Topup}, (400, 404, 409, 422), v.TopupCreate, parameters=(_path_id(),)),
    Operation("post", "/v1/accounts/{id}/topups/{order_id}/reversal", "reverseTopup", "Billing", "Reverse a top-up",
              "Reverse a top-up (operator)", OPERATOR,
              {201: r.Topup, 200: r.Topup}, (402, 404, 409),
              parameters=(_path_id(), {"name": "order_id", "in": "path", "required": True,
                                       "schema": {"type": "string", "minLength": 1, "maxLength": 200}})),
    Operation("get", "/v1/dead-deliveries", "listDeadDeliveries", "Deliveries", "List dead deliveries of every account",
              "Dead deliveries across accounts (operator)", OPERATOR,
              {200: r.DeliveryPage}, (422,), parameters=(_LIMIT, _ID_CURSOR)),
    Operation("get", "/v1/operator/dead-deliveries", "listFilteredDeadDeliveries", "Deliveries",
              "List dead deliveries by account, endpoint, reason, time",
              "Dead deliveries across accounts, newest first, filtered, with each endpoint's URL (operator)", OPERATOR,
              {200: operator_reads.DeadDeliveryPage}, (422,),
              parameters=(_LIMIT, _ID_CURSOR, _query("account_id", _UUID), _query("endpoint_id", _UUID),
                          _query("dead_reason", {"enum": list(DEAD_REASONS)}),
                          _query("died_after", _DATE_TIME, "Only deliveries that died at or after this time."),
                          _query("died_before", _DATE_TIME, "Only deliveries that died before this time."))),
    Operation("get", "/v1/operator/deliveries/{id}", "inspectDelivery", "Deliveries", "Inspect any account's delivery",
              "Any account's delivery with its endpoint, latest attempts and every ledger entry tied to it,"
              " adjustments too (operator)", OPERATOR, {200: operator_reads.InspectedDelivery}, (404,),
              parameters=(_path_id(),)),
    Operation("post", "/v1/operator/endpoints/{id}/disable", "disableEndpointAsOperator", "Endpoints",
              "Disable any account's endpoint",
              "Switch the endpoint off with disabled_reason 'operator': its account's operational endpoints receive"
              " endpoint.disabled (reason operator) and its pending deliveries are refunded. Idempotent: an endpoint"
              " already off is answered as it is, with its own reason (operator)", OPERATOR, {200: r.Endpoint}, (404,),
              parameters=(_path_id(),)),
    Operation("get", "/v1/account", "getOwnAccount", "Accounts", "Read the calling account",
              "The calling account: its status, balance, price per delivery and settings", ACCOUNT,
              {200: r.Account}),
    Operation("patch", "/v1/account", "updateOwnAccount", "Accounts", "Change the calling account's settings",
              "Set the calling account's payload_retention_days (1 to 3,650: how long a finished message's"
              " payload and its attempts' response excerpts are kept before the retention job erases them) and"
              " low_balance_threshold (balance.low is sent once when the balance falls below it, and again after a"
              " top-up lifts it above; null turns it off); a field left out is unchanged",
              ACCOUNT, {200: r.Account}, (400, 422), v.AccountPatch),
    Operation("get", "/v1/balance", "getBalance", "Billing", "Read the balance",
              "The balance and the credits in flight", ACCOUNT, {200: r.Balance}),
    Operation("get", "/v1/ledger", "listLedgerEntries", "Billing", "List ledger entries",
              "The account's ledger, oldest first", ACCOUNT, {200: r.LedgerPage}, (422,),
              parameters=(_LIMIT, _SEQ_CURSOR, _query("delivery_id", _UUID))),
    Operation("post", "/v1/api-keys", "createApiKey", "API keys", "Create an API key",
              "Create an API key (shown once)", ACCOUNT, {201: r.ApiKeyCreated},
              (400, 409, 422), v.Empty, body_optional=True, parameters=(_IDEMPOTENCY_KEY,), headers={201: _REPLAYED}),
    Operation("post", "/v1/accounts/{id}/api-keys", "createAccountApiKey", "API keys", "Create an API key for an account",
              "Create an API key for an account (operator; shown once)",
              OPERATOR, {201: r.ApiKeyCreated}, (400, 404, 409, 422), v.Empty, body_optional=True,
              parameters=(_path_id(), _IDEMPOTENCY_KEY), headers={201: _REPLAYED}),
    Operation("get", "/v1/api-keys", "listApiKeys", "API keys", "List API keys",
              "List API keys (prefixes only)", ACCOUNT, {200: r.ApiKeyList}),
    Operation("delete", "/v1/api-keys/{id}", "revokeApiKey", "API keys", "Revoke an API key",
              "Revoke an API key", ACCOUNT, {204: None}, (404,),
              parameters=(_path_id(),)),
    Operation("post", "/v1/endpoints", "createEndpoint", "Endpoints", "Create an endpoint",
              "Create an endpoint, signing with an HMAC secret (given, or made) or an Ed25519 key (made here; only its"
              " whpk_ public key is shown), with custom headers and a rate limit (rate_limit_per_second) if any", ACCOUNT, {201: r.Endpoint}, (400, 409, 422),
              v.EndpointCreate, parameters=(_IDEMPOTENCY_KEY,), headers={201: _REPLAYED}),
    Operation("get", "/v1/endpoints", "listEndpoints", "Endpoints", "List endpoints",
              "List endpoints", ACCOUNT, {200: r.EndpointList}),
    Operation("get", "/v1/endpoints/{id}", "getEndpoint", "Endpoints", "Read an endpoint",
              "Read an endpoint", ACCOUNT, {200: r.Endpoint}, (404,),
              parameters=(_path_id(),)),
    Operation("patch", "/v1/endpoints/{id}", "updateEndpoint", "Endpoints", "Change an endpoint",
              "Change an endpoint: only the fields given; null clears event_types (every type), headers and"
              " rate_limit_per_second (no limit)", ACCOUNT, {200: r.Endpoint}, (400, 404, 422),
              v.EndpointPatch, parameters=(_path_id(),)),
    Operation("delete", "/v1/endpoints/{id}", "deleteEndpoint", "Endpoints", "Delete an endpoint",
              "Delete an endpoint (its pending deliveries are refunded); again: 200, refunded_now 0", ACCOUNT,
              {200: r.EndpointDeleted}, (404,), parameters=(_path_id(),)),
    Operation("post", "/v1/endpoints/{id}/secret/rotate", "rotateEndpointSecret", "Endpoints", "Rotate an endpoint's signing secret",
              "Rotate the signing key to a new HMAC secret or Ed25519 key (signing_key_type; absent: the kind of"
              " secret if given, else the current kind). The old key signs 24 h more beside the new one, whatever"
              " their kinds (v1 and v1a signatures then); rotating to the current secret changes nothing. Answers"
              " what a receiver verifies the new key with: the whsec_ secret or the whpk_ public key",
              ACCOUNT, {200: r.EndpointSecret}, (400, 404, 409, 422), v.SecretRotate, body_optional=True,
              parameters=(_path_id(), _IDEMPOTENCY_KEY), headers={200: _REPLAYED}),
    Operation("get", "/v1/endpoints/{id}/secret", "getEndpointSecret", "Endpoints", "Read an endpoint's signing secret",
              "Read what a receiver verifies the current key with: the whsec_ secret, or the whpk_ public key of an"
              " Ed25519 key (its whsk_ private key is never shown)", ACCOUNT, {200: r.EndpointSecret}, (404,),
              parameters=(_path_id(),)),
    Operation("get", "/v1/endpoints/{id}/recover", "planEndpointRecovery", "Endpoints", "Plan the recovery of an endpoint's dead deliveries",
              "Plan a recovery: the endpoint's dead deliveries in [since, until) not replayed yet, by any replay (at most"
              f" {recover.REPLAYS_PER_CALL_MAX}), and the total a POST would charge now; writes nothing", ACCOUNT,
              {200: recover.RecoverPlan}, (404, 422),
              parameters=(_path_id(), _RECOVER_SINCE, _query("until", _DATE_TIME, "Default: now (PostgreSQL's clock)."))),
    Operation("post", "/v1/endpoints/{id}/recover", "recoverEndpoint", "Endpoints", "Replay an endpoint's dead deliveries",
              "Recover: replay the plan's dead deliveries as new charged deliveries, each sent under its dead"
              " delivery's webhook-id, if confirm_total is still the total (else 409 total-changed); all or nothing"
              " (402); more: call again", ACCOUNT,
              {202: recover.Recovered}, (402, 404, 409, 422), recover.RecoverCreate,
              parameters=(_path_id(), _IDEMPOTENCY_KEY), headers={202: _REPLAYED}),
    Operation("post", "/v1/messages", "createMessage", "Messages", "Send a message",
              "Send an event to the subscribed endpoints, charged per delivery", ACCOUNT,
              {202: r.MessageAccepted}, (400, 402, 409, 413, 422, 503), v.MessageCreate,
              parameters=(_IDEMPOTENCY_KEY,), headers={202: _REPLAYED}),
    Operation("post", "/v1/messages/{id}/expunge", "expungeMessage", "Messages", "Erase a message's payload now",
              "Erase the message's payload, and the response excerpts and custom headers sent of its deliveries'"
              " attempts, at once; the rows (ids, sizes, states, times, status codes) and the ledger stay. 409 message-live while any of its"
              " deliveries is pending or sending, with Retry-After (expunge once they have finished); 404 for an id"
              " that is not one of the account's messages. A second call answers the same. GET /v1/deliveries/{id}"
              " then says payload_erased_at, and a replay is refused 409", ACCOUNT,
              {200: r.MessageErased}, (400, 404, 409, 422), v.Empty, body_optional=True,
              parameters=(_path_id(),)),
    Operation("get", "/v1/deliveries", "listDeliveries", "Deliveries", "List deliveries",
              "List deliveries, newest first", ACCOUNT, {200: r.DeliveryPage}, (422,),
              parameters=(_LIMIT, _ID_CURSOR, _query("state", {"enum": list(DELIVERY_STATES)}),
                          _query("endpoint_id", _UUID), _query("message_id", _UUID),
                          _query("created_after", _DATE_TIME, "Only deliveries created after this time (exclusive)."),
                          _query("created_before", _DATE_TIME, "Only deliveries created before this time (exclusive)."))),
    Operation("get", "/v1/deliveries/{id}", "getDelivery", "Deliveries", "Read a delivery",
              "Read a delivery with its attempts and ledger entries", ACCOUNT,
              {200: r.DeliveryDetail}, (404,), parameters=(_path_id(),)),
    Operation("post", "/v1/deliveries/{id}/replay", "replayDelivery", "Deliveries", "Replay a delivery",
              "Send a dead or delivered delivery again: a new, charged delivery whose replay_of is this one, sent"
              " under this one's webhook-id (its webhook_id), so a receiver that deduplicates drops it if it"
              " processed this one; a recovery leaves this one out",
              ACCOUNT, {202: r.MessageAccepted}, (400, 402, 404, 409, 422, 503), v.Empty, body_optional=True,
              parameters=(_path_id(), _IDEMPOTENCY_KEY), headers={202: _REPLAYED}),
    *applications_operations,
    *event_type_operations,
    *(Operation(method, path, name, "Operational webhooks", summary, description, ACCOUNT, ok, errors, body,
                parameters=parameters, headers={201: _REPLAYED} if method == "post" else {})
      for method, path, name, summary, description, ok, errors, body, parameters in (
        ("post", "/v1/operational-endpoints", "createOperationalEndpoint", "Create an operational endpoint",
         "Where operational events go: a URL (checked as an endpoint's), the event types wanted (null: all) and"
         " its own whsec_ secret (given, or made and answered here)", {201: operational.OperationalEndpointCreated},
         (400, 409, 422), operational.OperationalEndpointCreate, (_IDEMPOTENCY_KEY,)),
        ("get", "/v1/operational-endpoints", "listOperationalEndpoints", "List operational endpoints",
         "The account's operational endpoints", {200: operational.OperationalEndpointList}, (), None, ()),
        ("get", "/v1/operational-endpoints/{id}", "getOperationalEndpoint", "Read an operational endpoint",
         "Read one of the account's operational endpoints", {200: operational.OperationalEndpoint}, (404,), None,
         (_path_id(),)),
        ("patch", "/v1/operational-endpoints/{id}", "updateOperationalEndpoint", "Change an operational endpoint",
         "Change its URL, description, event types or enabled flag", {200: operational.OperationalEndpoint},
         (400, 404, 422), operational.OperationalEndpointPatch, (_path_id(),)),
        ("delete", "/v1/operational-endpoints/{id}", "deleteOperationalEndpoint", "Delete an operational endpoint",
         "Delete it: nothing more is sent to it", {204: None}, (404,), None, (_path_id(),)),
        ("get", "/v1/operational-endpoints/{id}/secret", "getOperationalEndpointSecret",
         "Read an operational endpoint's secret", "The whsec_ secret its webhooks are signed with",
         {200: operational.OperationalSecret}, (404,), None, (_path_id(),)),
        ("get", "/v1/operational-events", "listOperationalEvents", "List operational events",
         "The account's operational events, oldest first (what it may have missed), of one type if asked",
         {200: operational.OperationalEventPage}, (422,), None,
         (_LIMIT, _SEQ_CURSOR, _query("type", {"enum": list(OPERATIONAL_EVENT_TYPES)}))),
        ("get", "/v1/operational-events/{id}", "getOperationalEvent", "Read an operational event",
         "One of the account's operational events; its id is the webhook-id it was sent under",
         {200: operational.OperationalEvent}, (404,), None, (_path_id(),)),
      )),
    Operation("get", "/healthz", "getHealth", "Health", "Liveness",
              "The process is up", None, {200: r.Health}),
    Operation("get", "/readyz", "getReadiness", "Health", "Readiness",
              "PostgreSQL and Redis are reachable", None, {200: r.Readiness, 503: r.Readiness}),
)

_UNAVAILABLE = ("Unavailable; retry after Retry-After. overloaded, shutting-down and write-failed wrote nothing;"
                " after write-outcome-unknown, or database-unavailable on a write, the write may have happened:"
                " repeat only what is safe to repeat (a send with its Idempotency-Key is)")
_DESCRIPTIONS = {200: "OK", 201: "Created", 202: "Accepted", 204: "No content", 400: "Malformed JSON",
                 401: "Missing or wrong API key", 402: "The balance cannot cover every delivery; nothing was written",
                 403: "The key may not call this route", 404: "No such resource (or not yours)",
                 409: "Conflict with the current state", 413: "Payload too large",
                 415: "The body is not declared JSON: send Content-Type: application/json",
                 422: "Invalid request; errors lists each field", 503: _UNAVAILABLE}


EXAMPLES = {**examples.EXAMPLES, **operator_reads.EXAMPLES}
REQUEST_BODY_TYPES = (*v.REQUEST_BODIES, v.Empty, *recover.REQUEST_BODIES, *operational.REQUEST_BODIES,
                      *applications.REQUEST_BODIES, *event_types.REQUEST_BODIES)


def _schemas() -> dict:
    kinds = (*REQUEST_BODY_TYPES, *r.RESPONSE_BODIES, *recover.RESPONSE_BODIES, *operator_reads.RESPONSE_BODIES,
             *operational.RESPONSE_BODIES, *applications.RESPONSE_BODIES, *event_types.RESPONSE_BODIES,
             ProblemBody)
    _, components = msgspec.json.schema_components(kinds, ref_template="#/components/schemas/{name}")
    for name, schema in components.items():
        schema["examples"] = [EXAMPLES[name]]
    return components


def _ref(kind: type) -> dict:
    return {"$ref": f"#/components/schemas/{kind.__name__}"}


def _media(kind: type) -> dict:
    return {"schema": _ref(kind), "example": EXAMPLES[kind.__name__]}


def _operation(op: Operation) -> dict:
    who = {ACCOUNT: " Called with an account's API key.", OPERATOR: " Called with the operator key."}.get(op.auth, "")
    result: dict = {"operationId": op.operation_id, "tags": [op.tag], "summary": op.summary,
                    "description": op.description + "." + who, "responses": {}}
    if op.parameters:
        result["parameters"] = list(op.parameters)
    errors = set(op.errors)
    if op.body is not None:
        result["requestBody"] = {"required": not op.body_optional,
                                 "content": {"application/json": _media(op.body)}}
        errors |= {400, 413, 415}  # malformed JSON; a body over the size limit; a body declared not JSON
    for status, kind in op.ok.items():
        response: dict = {"description": _DESCRIPTIONS[status]}
        if kind is not None:
            response["content"] = {"application/json": _media(kind)}
        if status in op.headers:
            response["headers"] = op.headers[status]
        result["responses"][str(status)] = response
    if op.auth is not None:
        result["security"] = [{"bearer": []}]
        errors |= {401, 403, 503}  # 503: the database is unavailable (every authenticated route reads it)
    for status in sorted(errors):
        result["responses"][str(status)] = {
            "description": _DESCRIPTIONS[status],
            "content": {"application/problem+json": {"schema": _ref(ProblemBody),
                                                     "example": examples.problem(status)}},
        }
        if status in _RETRY_AFTER_STATUSES:
            result["responses"][str(status)]["headers"] = _RETRY_AFTER
    return result


_RETRY_AFTER_STATUSES = (409, 503)
_RETRY_AFTER = {"Retry-After": {
    "description": "Seconds to wait before retrying: on every 503, and on a 409 idempotency-key-in-use",
    "schema": {"type": "string", "pattern": "^[0-9]+$"}}}


_INFO = ("Webhook delivery billed per delivery. Request bodies are JSON (UTF-8), sent with"
         " Content-Type: application/json (or a +json type); a body declared as anything else answers 415, and"
         " one without Content-Type is read as JSON. A field given twice in a body answers 422 (a message's"
         " payload is sent as written: its own objects are not checked). An integer field takes any JSON number"
         " with a whole value (1, 1.0 and 1e0 are the same), read exactly; 1.5 answers 422. A 422 lists every"
         " field that is wrong, each with what it allows. Query values must not contain control characters.")


def document() -> dict:
    paths: dict = {}
    for op in OPERATIONS:
        paths.setdefault(op.path, {})[op.method] = _operation(op)
    paths["/metrics"] = {"get": {"operationId": "getMetrics", "tags": ["Health"], "summary": "Prometheus metrics",
                                 "description": "The API's and the workers' series in the Prometheus text format.",
                                 "responses": {"200": {"description": "OK", "content": {"text/plain": {"schema": {"type": "string"}}}}}}}
    return {
        "openapi": "3.1.0",
        "info": {"title": "hookledger", "version": "1", "description": _INFO},
        "tags": [{"name": name, "description": text} for name, text in TAGS.items()],
        "paths": paths,
        "webhooks": openapi_operational.webhooks(),
        "components": {
            "schemas": _schemas(),
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer",
                                           "description": "An account key (hl_live_...) or the operator key."}},
        },
    }
