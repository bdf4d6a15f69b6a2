"""The HTTP API (aiohttp.web), versioned under /v1: accounts, keys, endpoints, messages, deliveries,
operational endpoints and events (routes_operational).

`delivery.platform.web_app.create_app(settings, pool, queue)` builds the application; `hookledger api`
serves it. Creates go through the group-commit coalescer (`group_commit.py`); reads are named
SQL statements in `reads.py`; errors are application/problem+json (`problems.py`).
"""
