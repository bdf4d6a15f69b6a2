"""The README's receiver example is real code: it runs, verifies, dedupes, and matches the text."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

from signing import example_receiver
from signing.keys import generate_secret
from signing.signatures import webhook_headers

SIGNING_DIRECTORY = Path(example_receiver.__file__).parent


def test_receiving_md_shows_the_example_file_verbatim():
    """The code block in RECEIVING.md is exactly `signing/example_receiver.py`, so it cannot drift."""
    document = (SIGNING_DIRECTORY / "RECEIVING.md").read_text()
    [code] = re.findall(r"```python\n(.*?)```", document, flags=re.DOTALL)
    assert code == (SIGNING_DIRECTORY / "example_receiver.py").read_text()
    assert document.startswith("## Receiving webhooks\n")


async def test_the_example_receiver_processes_a_signed_webhook_once(serve, http, capsys):
    """Over loopback: a signed request is processed (200), its copy is a duplicate, a forgery is 401."""
    secret = generate_secret()
    url = await serve(example_receiver.create_app([secret]))
    body = json.dumps({"type": "invoice.paid", "data": {"id": "inv_1"}}).encode()
    headers = webhook_headers("evt_example", int(time.time()), body, [secret])
    for expected in ({"id": "evt_example", "received": True}, {"id": "evt_example", "duplicate": True}):
        async with http.post(url, data=body, headers=headers) as response:
            assert response.status == 200 and await response.json() == expected
    assert capsys.readouterr().out.count("evt_example at") == 1
    forged = webhook_headers("evt_forged", int(time.time()), body, [generate_secret()])
    async with http.post(url, data=body, headers=forged) as response:
        assert response.status == 401
