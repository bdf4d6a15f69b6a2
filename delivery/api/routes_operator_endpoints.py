"""The operator's writes to any account's endpoints.

`POST /v1/operator/endpoints/{id}/disable` switches an endpoint off with disabled_reason
'operator' (an abusive or broken receiver, a request from its owner): the account is told by
endpoint.disabled (reason operator) on its operational endpoints, and the endpoint's pending
deliveries are refunded at their pre-send check. Idempotent: an endpoint already off is answered
as it is, with its own reason, and writes nothing. An unknown id answers 404.
"""

from __future__ import annotations

from aiohttp import web

from delivery.api import responses
from delivery.api.context import context
from delivery.api.problems import not_found
from delivery.api.validation import path_id
from delivery.store import endpoints as store

routes = web.RouteTableDef()


@routes.post("/v1/operator/endpoints/{id}/disable")
async def disable_endpoint(request: web.Request) -> web.Response:
    ctx = context(request)
    await ctx.operator(request)
    endpoint_id = path_id(request.match_info["id"])
    endpoint = None if endpoint_id is None else await store.disable_by_operator(ctx.pool, endpoint_id)
    if endpoint is None:
        raise not_found("endpoint")
    return responses.json(responses.from_row(responses.Endpoint, endpoint))
