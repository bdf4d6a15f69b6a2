"""`hookledger listen` as a real process: it verifies, prints and answers like a production receiver."""

from __future__ import annotations

import json
import os
import re
import selectors
import signal
import subprocess
import sys
import time
import uuid

import httpx
import pytest

from delivery.platform.run import free_port
from signing import generate_secret, webhook_headers

LINE_WAIT_SECONDS = 15.0


class Listener:
    """A `hookledger listen --port 0` subprocess and the lines it prints."""

    def __init__(self, *args: str, env: dict[str, str] | None = None, port: str = "0") -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "delivery", "listen", "--port", port, *args],
            env={**os.environ, "COLUMNS": "250", **(env or {})}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )
        self._selector = selectors.DefaultSelector()
        self._selector.register(self.process.stdout, selectors.EVENT_READ)
        line = self.line()
        match = re.search(r"listening on (http://127\.0\.0\.1:\d+)/", line)
        assert match, line
        self.url = match.group(1)

    def line(self) -> str:
        """The next printed line; fails the test if none comes in time."""
        deadline = time.monotonic() + LINE_WAIT_SECONDS
        while time.monotonic() < deadline:
            if self._selector.select(timeout=0.1):
                raw = self.process.stdout.readline()
                if not raw:
                    pytest.fail(f"listen exited with {self.process.wait()}")
                return raw.decode().rstrip("\n")
        pytest.fail("listen printed nothing in time")

    def post(self, body: bytes, headers: dict[str, str]) -> httpx.Response:
        return httpx.post(f"{self.url}/webhooks", content=body, headers=headers, timeout=5)

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
        try:
            return self.process.wait(10)
        finally:
            self._selector.close()
            self.process.stdout.close()


@pytest.fixture
def secret() -> str:
    return generate_secret()


def test_listen_prints_verified_webhooks_and_refuses_bad_ones(secret):
    """Signed: 200 and a line with id, event type and payload; again: 200 as a duplicate; wrong
    signature, stale timestamp, missing headers: 401 and a line with the reason. Ctrl-C exits 0."""
    listener = Listener("--secret", secret)
    try:
        body = b'{"type": "invoice.paid", "data": {"invoice": "in_1"}}'
        now = int(time.time())
        good = webhook_headers("msg_good_1", now, body, [secret])
        response = listener.post(body, good)
        assert response.status_code == 200 and response.json() == {"id": "msg_good_1", "received": True}
        line = listener.line()
        assert line.startswith("received msg_good_1  invoice.paid  signed ") and '"invoice": "in_1"' in line

        assert listener.post(body, good).status_code == 200
        assert listener.line() == "duplicate msg_good_1  already received; answered 200"

        forged = webhook_headers("msg_bad_1", now, body, [generate_secret()])
        refused = listener.post(body, forged)
        assert refused.status_code == 401 and refused.headers["Content-Type"].startswith("application/problem+json")
        line = listener.line()
        assert line.startswith("refused 401 msg_bad_1  ") and "signature" in line.lower()

        stale = webhook_headers("msg_old_1", now - 3600, body, [secret])
        assert listener.post(body, stale).status_code == 401
        assert listener.line().startswith("refused 401 msg_old_1  ")

        assert listener.post(body, {}).status_code == 401
        assert listener.line().startswith("refused 401 (no webhook-id)")
    finally:
        code = listener.stop()
    assert code == 0


def test_listen_verifies_with_the_secret_of_an_endpoint_fetched_from_the_api(cli, api_url):
    _, key = cli.account()
    endpoint_id = json.loads(cli("endpoints", "create", "https://example.com/h", "--json", key=key).stdout)["id"]
    endpoint_secret = cli("endpoints", "secret", endpoint_id, key=key).stdout.strip()
    listener = Listener("--secret-from-endpoint", endpoint_id,
                        env={"HOOKLEDGER_API_URL": api_url, "HOOKLEDGER_API_KEY": key})
    try:
        body = b'{"n": 1}'
        delivery_id = str(uuid.uuid4())
        response = listener.post(body, webhook_headers(delivery_id, int(time.time()), body, [endpoint_secret]))
        assert response.status_code == 200
        assert listener.line().startswith(f"received {delivery_id}  -  signed ")
    finally:
        assert listener.stop() == 0


def test_listen_without_a_secret_is_a_usage_error(cli):
    result = cli("listen", "--port", "0")
    assert result.exit_code == 2 and "--secret" in result.stderr
    bad = cli("listen", "--port", "0", "--secret", "whsec_???")
    assert bad.exit_code == 2


@pytest.mark.parametrize("tolerance", ["nan", "-1", "0", "inf"])
def test_listen_with_a_tolerance_that_is_not_finite_and_positive_is_a_usage_error(secret, tolerance):
    """NaN or -1 would refuse every webhook and infinity accept any replay: refused before listening
    (a real process, so a listener that starts anyway fails the test by its timeout)."""
    arguments = ["listen", "--port", "0", "--secret", secret, "--tolerance-seconds", tolerance]
    result = subprocess.run([sys.executable, "-m", "delivery", *arguments], env={**os.environ, "COLUMNS": "250"},
                            capture_output=True, text=True, timeout=LINE_WAIT_SECONDS)
    assert result.returncode == 2 and "--tolerance-seconds must be a finite number" in result.stderr


def test_a_send_reaches_listen_through_the_real_worker(cli, api_url, worker):
    """End to end: `send` through the API, a real worker signs and delivers it to `listen`, which
    verifies it with the endpoint's secret; the delivery then lists as delivered."""
    _, key = cli.account()
    env = {"HOOKLEDGER_API_URL": api_url, "HOOKLEDGER_API_KEY": key}
    listener = None
    try:
        port = str(free_port())  # the endpoint must name the port before the listener can fetch its secret
        created = cli("endpoints", "create", f"http://127.0.0.1:{port}/hooks", "--json", key=key)
        endpoint_id = json.loads(created.stdout)["id"]
        listener = Listener("--secret-from-endpoint", endpoint_id, env=env, port=port)
        sent = json.loads(cli("send", "invoice.paid", '{"type": "invoice.paid", "n": 7}', "--json", key=key).stdout)
        delivery_id = sent["deliveries"][0]["id"]
        line = listener.line()
        assert line.startswith(f"received {delivery_id}  invoice.paid  signed ") and '"n": 7' in line
        deadline = time.monotonic() + LINE_WAIT_SECONDS
        while time.monotonic() < deadline:
            listed = json.loads(cli("deliveries", "list", "--state", "delivered", "--json", key=key).stdout)
            if [d["id"] for d in listed["data"]] == [delivery_id]:
                break
            time.sleep(0.2)
        else:
            pytest.fail(f"the delivery was not recorded as delivered:\n{worker.read_text()}")
    finally:
        if listener is not None:
            assert listener.stop() == 0
