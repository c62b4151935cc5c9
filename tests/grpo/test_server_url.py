"""One way to name a server (issue 13): the root or the root plus ``/v1/training``, for the
GRPO client and the conformance suite alike; a client error names the full URL it requested."""

from __future__ import annotations

import httpx
import pytest

from grpo.client import WhitneyClient, server_root
from grpo.errors import ConnectionFailed, NotFoundError


@pytest.mark.parametrize("given", [
    "http://127.0.0.1:8765", "http://127.0.0.1:8765/", "http://127.0.0.1:8765/v1/training",
    "http://127.0.0.1:8765/v1/training/", " http://127.0.0.1:8765/v1/training//",
])
def test_root_or_root_plus_prefix_name_the_same_server(given: str) -> None:
    assert server_root(given) == "http://127.0.0.1:8765"


def test_a_root_with_a_path_keeps_it() -> None:
    assert server_root("https://api.example/whitney/v1/training") == "https://api.example/whitney"
    with pytest.raises(ValueError, match="expected http"):
        server_root("127.0.0.1:8765")


class Recorder(httpx.BaseTransport):
    """Answers 404 in the contract's envelope and records every requested URL."""

    def __init__(self) -> None:
        self.urls: list[str] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.urls.append(str(request.url))
        return httpx.Response(404, json={"error": {"type": "not_found", "message": "no",
                                                   "details": {}}})


@pytest.mark.parametrize("given", ["http://whitney.test:9", "http://whitney.test:9/v1/training"])
def test_requests_go_to_one_prefix_and_errors_name_the_full_url(given: str) -> None:
    recorder = Recorder()
    with WhitneyClient.connect(given, "key", transport=recorder) as client:
        with pytest.raises(NotFoundError) as caught:
            client.capabilities()
    url = "http://whitney.test:9/v1/training/capabilities"
    assert recorder.urls == [url]
    assert caught.value.url == url and f"GET {url} -> 404 not_found" in str(caught.value)


def test_a_connection_error_names_the_full_url() -> None:
    class Refusing(httpx.BaseTransport):
        def handle_request(self, request: httpx.Request) -> httpx.Response:
            raise httpx.ConnectError("refused", request=request)

    client = WhitneyClient.connect("http://whitney.test:9/v1/training/", "key",
                                   transport=Refusing())
    client.retry = type(client.retry)(max_attempts=1)
    with pytest.raises(ConnectionFailed, match="GET http://whitney.test:9/v1/training/capabilities"):
        client.capabilities()


@pytest.mark.parametrize("given", ["http://127.0.0.1:8765", "http://127.0.0.1:8765/v1/training/"])
def test_the_conformance_suite_takes_the_same_two_forms(given: str) -> None:
    from conformance.target import open_target, server_root

    assert server_root(given) == "http://127.0.0.1:8765"
    target = open_target(given, "key", use_env=False)
    assert target.base_url == "http://127.0.0.1:8765"
    client = target.client()
    assert str(client.build_request("GET", "/capabilities").url) == \
        "http://127.0.0.1:8765/v1/training/capabilities"
    target.close()
