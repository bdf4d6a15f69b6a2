"""Property-based API testing with schemathesis against /openapi.json of the running server: for
positive and negative examples of every operation, no 5xx, and every response (status, content
type, headers, body) conforms to the document. Seeded and bounded to stay well under a minute.

The server runs as `hookledger api` in a subprocess on a loopback port (schemathesis's sync
runner and pytest-asyncio's loop stay apart), on a fresh database of this test's own.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest
import requests


schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis.errors import Unsatisfiable  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402
from schemathesis.generation import GenerationMode  # noqa: E402
from schemathesis.specs.openapi.checks import (  # noqa: E402
    content_type_conformance,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

EXAMPLES_PER_OPERATION = 50
SEED = 20261130
OPERATOR_KEY = "op_schemathesis_" + "k" * 32
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_headers_conformance,
          response_schema_conformance]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def server(make_database, redis_server_url):
    database_url = make_database("hookledger_st")
    port = _free_port()
    environment = {
        **os.environ,
        "DATABASE_URL": database_url,
        "REDIS_URL": redis_server_url,
        "HOOKLEDGER_OPERATOR_KEY": OPERATOR_KEY,
        "HOOKLEDGER_SECRET_KEYS": "k1:" + "A" * 43 + "=",
        "HOOKLEDGER_DEV": "1",
        "HOOKLEDGER_API_PORT": str(port),
        "HOOKLEDGER_LOG_LEVEL": "warning",
    }
    process = subprocess.Popen([sys.executable, "-m", "delivery", "api"], env=environment,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    base_url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if requests.get(f"{base_url}/readyz", timeout=1).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            assert process.poll() is None, process.stderr.read().decode()
            assert time.monotonic() < deadline, "the API did not become ready"
            time.sleep(0.1)
        yield base_url
    finally:
        process.terminate()
        process.wait(timeout=15)


def _seed(base_url: str) -> dict[str, str]:
    """An account with credits, an endpoint and a message, so that some generated requests find data."""
    operator = {"Authorization": f"Bearer {OPERATOR_KEY}"}
    created = requests.post(f"{base_url}/v1/accounts", json={"name": "st"}, headers=operator).json()
    account_id = created["account"]["id"]
    requests.post(f"{base_url}/v1/accounts/{account_id}/topups", json={"order_id": "seed", "amount": 10**9}, headers=operator)
    account = {"Authorization": f"Bearer {created['api_key']['key']}"}
    requests.post(f"{base_url}/v1/endpoints", json={"url": "https://example.com/h"}, headers=account)
    assert requests.post(f"{base_url}/v1/messages", json={"event_type": "a", "payload": 1}, headers=account).status_code == 202
    return account


def test_every_operation_conforms_to_the_document(server):
    """Each operation, with the key its role needs, in positive and negative modes: no 5xx, responses as documented."""
    account = _seed(server)
    operator = {"Authorization": f"Bearer {OPERATOR_KEY}"}
    schema = schemathesis.openapi.from_url(f"{server}/openapi.json")
    session = requests.Session()
    failures: list[str] = []
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 20
    for operation in operations:
        headers = operator if operation.path in _OPERATOR_PATHS else account
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            checks = CHECKS + ([negative_data_rejection] if mode is GenerationMode.NEGATIVE else [])

            @settings(max_examples=EXAMPLES_PER_OPERATION, derandomize=True, database=None, deadline=None,
                      phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
            @given(case=operation.as_strategy(generation_mode=mode))
            def run(case):
                case.call_and_validate(base_url=server, session=session, headers=_auth(case, headers), checks=checks)

            try:
                run()
            except Unsatisfiable:
                # Negative mode has nothing to negate on an operation with no parameters and no body.
                assert mode is GenerationMode.NEGATIVE
            except Exception as error:  # collect every operation's failure, then report them together
                failures.append(f"{operation.method.upper()} {operation.path} [{mode.value}]: {error}")
    assert not failures, "\n\n".join(failures)


def _auth(case, headers: dict[str, str]) -> dict[str, str] | None:
    """The key to send: none when the case negates its headers. A negative case may leave out the
    required Authorization on purpose; adding the key back made such a request valid, the API
    answered it 200, and schemathesis called that accepting invalid data (which case it drew
    depended on the server's port, in the document). Without a key every such case must be 401."""
    components = case.meta.components if case.meta is not None else {}
    negated = any(location.name.lower() == "header" and info.mode is GenerationMode.NEGATIVE
                  for location, info in components.items())
    return None if negated else headers


_OPERATOR_PATHS = {"/v1/accounts", "/v1/accounts/{id}", "/v1/accounts/{id}/topups",
                   "/v1/accounts/{id}/topups/{order_id}/reversal", "/v1/dead-deliveries"}
