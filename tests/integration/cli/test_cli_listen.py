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
            bufsize=0,  # unbuffered: a readline must not take the next line too, where select no longer sees it
        )
        self._selector = selectors.DefaultSelector()
        self._selector.register(self.process.stdout, selectors.EVENT_READ)
        line = self.line()
        if line.startswith("{"):  # --json
            self.url = json.loads(line)["url"].rstrip("/")
        else:
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
        reason = line.removeprefix("refused 401 msg_bad_1  ")
        assert reason.count(reason.split(" (")[0]) == 1, reason  # said once: not "title (title (detail))"

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


class App:
    """The developer's own app that `listen --forward-to` forwards to: records each request and
    answers with the next status of `statuses` (then 200)."""

    def __init__(self, *statuses: int) -> None:
        import http.server
        import threading

        self.requests: list[tuple[dict[str, str], bytes]] = []
        self.statuses = list(statuses)
        app = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                app.requests.append(({k.lower(): v for k, v in self.headers.items()}, body))
                status = app.statuses.pop(0) if app.statuses else 200
                answer = json.dumps({"handled": status < 300}).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_listen_forwards_verified_webhooks_to_the_app_and_reports_its_status(secret):
    """--forward-to: the app gets the body and the signed headers as sent, so it verifies them itself;
    the sender gets the app's answer. An app's 500 goes back as 500 and the webhook stays unclaimed,
    so the retry is forwarded again; a forged webhook never reaches the app; an app that does not
    answer is a 502 "forward failed"."""
    app = App(500)
    listener = Listener("--secret", secret, "--forward-to", app.url)
    try:
        body = b'{"type": "invoice.paid", "n": 1}'
        headers = webhook_headers("msg_fwd_1", int(time.time()), body, [secret])
        failed = listener.post(body, headers)
        assert failed.status_code == 500 and failed.json() == {"handled": False}
        assert listener.line().startswith("received msg_fwd_1  invoice.paid")
        assert re.fullmatch(rf"forwarded msg_fwd_1  {re.escape(app.url)}  500  \d+ ms", listener.line())
        retried = listener.post(body, headers)
        assert retried.status_code == 200 and retried.json() == {"handled": True}
        listener.line()
        assert listener.line().startswith(f"forwarded msg_fwd_1  {app.url}  200  ")
        assert len(app.requests) == 2
        forwarded_headers, forwarded_body = app.requests[-1]
        assert forwarded_body == body
        for name in ("webhook-id", "webhook-timestamp", "webhook-signature"):
            assert forwarded_headers[name] == headers[name], name
        forged = listener.post(body, webhook_headers("msg_fwd_2", int(time.time()), body, [generate_secret()]))
        assert forged.status_code == 401 and listener.line().startswith("refused 401 msg_fwd_2")
        assert len(app.requests) == 2
    finally:
        assert listener.stop() == 0
        app.close()
    down = Listener("--secret", secret, "--forward-to", f"http://127.0.0.1:{free_port()}/hooks")
    try:
        body = b'{"n": 2}'
        assert down.post(body, webhook_headers("msg_fwd_3", int(time.time()), body, [secret])).status_code == 502
        down.line()
        assert down.line().startswith("forward failed msg_fwd_3  http://127.0.0.1:")
    finally:
        assert down.stop() == 0


def test_listen_json_prints_one_object_a_line(secret):
    listener = Listener("--secret", secret, "--json")
    try:
        body = b'{"type": "invoice.paid"}'
        assert listener.post(body, webhook_headers("msg_json_1", int(time.time()), body, [secret])).status_code == 200
        received = json.loads(listener.line())
        assert received["event"] == "received" and received["id"] == "msg_json_1"
        assert received["event_type"] == "invoice.paid" and received["payload"] == {"type": "invoice.paid"}
        assert listener.post(body, {}).status_code == 401
        refused = json.loads(listener.line())
        assert refused["event"] == "refused" and refused["status"] == 401 and refused["id"] is None
    finally:
        assert listener.stop() == 0


def test_listen_with_a_forward_url_that_is_not_http_is_a_usage_error(cli, secret):
    result = cli("listen", "--port", "0", "--secret", secret, "--forward-to", "localhost:3000")
    assert result.exit_code == 2 and "--forward-to must be an http(s) URL" in result.stderr
