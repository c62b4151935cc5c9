"""Every parameter the suite sends is derived from the server's capabilities (DISC-1): token
ids, ``top_k``, prompt lengths, ``max_tokens``, ``num_samples`` and the number of datums. No
check assumes the mock's byte vocabulary (258 tokens, EOS 257) or its limits.

The endpoint is the embedded mock behind a wire-level rewrite that declares a 32-token
vocabulary (EOS 31), a 40-token context and small limits, and maps sampled tokens into that
vocabulary. The mock itself still runs its byte model, so checks may pass or fail here; what is
pinned is what the suite *sends*: within the declared bounds, except the deliberate
out-of-range probes of ERR-2 and ERR-3, which step over one bound by the least amount.
"""

from __future__ import annotations

import threading
from typing import Any

import httpx
import orjson

from conformance import run_suite
from conformance.options import Options
from conformance.target import (
    EMBEDDED_API_KEY,
    EMBEDDED_BASE_URL,
    EMBEDDED_DEFAULTS,
    EMBEDDED_SECOND_API_KEY,
    Target,
)
from mock_server import InProcessTransport, create_app

V, EOS, CONTEXT = 32, 31, 40
LIMITS = {"max_sample_tokens": 4, "max_num_samples": 3, "max_datums_per_request": 6}


class SmallServer(httpx.BaseTransport):
    """Declares a small model and small limits; records every JSON request body."""

    def __init__(self) -> None:
        self.inner = InProcessTransport(create_app(
            api_keys=(EMBEDDED_API_KEY, EMBEDDED_SECOND_API_KEY),
            **{**EMBEDDED_DEFAULTS, "order_wait_ms": 300}))
        self.sent: list[tuple[str, Any]] = []
        self._lock = threading.Lock()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        body = request.read()
        try:
            parsed = orjson.loads(body) if body else None
        except orjson.JSONDecodeError:
            parsed = None
        with self._lock:
            self.sent.append((request.url.path.rsplit("/", 1)[-1], parsed))
        response = self.inner.handle_request(request)
        if response.status_code != 200 or "json" not in response.headers.get("content-type", ""):
            return response
        document = orjson.loads(response.content)
        if request.url.path.endswith("/capabilities"):
            document["base_models"][0].update(vocab_size=V, eos_token_id=EOS,
                                              max_context=CONTEXT)
            document["limits"].update(LIMITS)
        elif request.url.path.endswith("/sample"):
            for sequence in document["sequences"]:
                sequence["tokens"] = [t % V for t in sequence["tokens"]]
        else:
            return response
        headers = {k: v for k, v in response.headers.items() if k.lower() != "content-length"}
        return httpx.Response(200, headers=headers, content=orjson.dumps(document))

    def close(self) -> None:
        self.inner.close()


def _token_lists(primitive: str, body: dict[str, Any]) -> list[list[Any]]:
    lists = [body.get("token_ids")] if primitive == "logprobs" else []
    lists.append((body.get("prompt") or {}).get("token_ids"))
    for datum in body.get("data") or []:
        if isinstance(datum, dict):
            lists.append((datum.get("model_input") or {}).get("token_ids"))
            lists.append((datum.get("loss_inputs") or {}).get("target_tokens"))
    return [values for values in lists if isinstance(values, list)]


def test_every_request_fits_the_declared_vocabulary_context_and_limits() -> None:
    server = SmallServer()
    target = Target(base_url=EMBEDDED_BASE_URL, api_key=EMBEDDED_API_KEY,
                    second_api_key=EMBEDDED_SECOND_API_KEY, timeout=30.0, embedded=True,
                    transport=server)
    try:
        run_suite(target, options=Options(fuzz_examples=0))
    finally:
        target.close()
    seen = {"token": set(), "top_k": set(), "max_tokens": set(), "num_samples": set(),
            "datums": set(), "context": set()}
    for primitive, body in server.sent:
        if not isinstance(body, dict):
            continue
        for values in _token_lists(primitive, body):
            seen["token"].update(v for v in values if isinstance(v, int))
        sampling = body.get("sampling")
        if primitive == "sample" and isinstance(sampling, dict):
            seen["top_k"].add(sampling.get("top_k"))
            seen["max_tokens"].add(sampling.get("max_tokens"))
            seen["num_samples"].add(body.get("num_samples"))
            prompt = (body.get("prompt") or {}).get("token_ids") or []
            if isinstance(sampling.get("max_tokens"), int):
                seen["context"].add(len(prompt) + sampling["max_tokens"])
        if primitive in ("forward", "forward_backward") and isinstance(body.get("data"), list):
            seen["datums"].add(len(body["data"]))
    assert len(server.sent) > 500 and seen["top_k"] and seen["datums"]
    # In range, or a deliberate probe: -1, vocab_size (token ids), vocab_size + 5 (ERR-3).
    assert seen["token"] <= set(range(V)) | {-1, V, V + 5}, sorted(seen["token"] - set(range(V)))
    assert seen["top_k"] <= set(range(V)) | {-1, V + 1}, sorted(seen["top_k"])
    assert max(seen["top_k"] - {V + 1}) < V  # a top_k that truncates: never the whole vocab
    assert seen["max_tokens"] <= set(range(1, 5)) | {0, 5}, sorted(seen["max_tokens"])
    assert seen["num_samples"] <= {1, 2, 3} | {0, 4}, sorted(seen["num_samples"])
    assert max(seen["context"]) <= CONTEXT + 1, sorted(seen["context"])  # +1: the 4a probe
    assert seen["datums"] <= set(range(1, 7)) | {7}, sorted(seen["datums"])
