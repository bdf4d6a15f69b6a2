"""A complete webhook receiver: verify, dedupe, process.

Run: WEBHOOK_SECRET=whsec_... python -m signing.example_receiver
"""

import os

from aiohttp import web

from signing import MemoryDedupeStore, WebhookEvent, webhook_handler


async def on_webhook(event: WebhookEvent) -> None:
    # Runs once per webhook id, only for requests signed with our secret within 5 minutes.
    print(f"{event.id} at {event.timestamp_seconds}: {event.payload['type']}")


def create_app(secrets: list[str]) -> web.Application:
    app = web.Application()
    handler = webhook_handler(on_webhook, keys=secrets, dedupe=MemoryDedupeStore())
    app.router.add_post("/webhooks", handler)
    return app


if __name__ == "__main__":
    web.run_app(create_app(os.environ["WEBHOOK_SECRET"].split()), port=int(os.environ.get("PORT", "8000")))
