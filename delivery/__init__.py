"""Everything that moves webhooks, one subpackage per part (imports billing and signing).

    engine/      the worker pipeline: claim, pre-send check, send, record, retry
    store/       endpoint storage, signing-key cache, stored idempotent answers
    operations/  account deletion and repair, dead letters and replays, the audit report
    api/         the HTTP API: routes, validation, group commit, OpenAPI
    dashboard/   the account and operator pages
    platform/    configuration, servers, the web app, the api and worker processes, `hookledger run`
    cli/         the `hookledger` command
    client/      the Python SDK: imports nothing of ours but itself
    chaos/       the chaos harness

The root modules (errors, metrics, event_loop, gc_tuning) are the floor every part stands on.
Layers, top to bottom: cli and chaos, platform, dashboard, api, operations, engine, store; the
import-linter contracts in pyproject.toml check them.
"""
