"""The delivery engine: what a worker does with a due delivery.

claim (claims) -> pre-send check (presend) -> sign and send (sender, send_lanes, send_budget)
-> record the answer quoting the attempt (results) -> retry or settle (retry, endpoint_health),
driven by pipeline.Engine and woken through the job queue (queue). The sender's HTTP is the lean
client (wire, wire_pool) or aiohttp's (sender_aiohttp), both answering in send_outcome's terms.
The SSRF guard (ssrf) is the sender's and the API's. Imports billing, signing, delivery.store and the root modules
(errors, metrics, event_loop); never an interface (api, dashboard, cli) or the platform.
"""
