"""Request generators and per-request invariants for ``tests/http/test_fuzz.py``
(ERR-1..4, ORD-3/4).

``draw_request`` builds one hostile request (mutated, extreme-valued, wrong-seq, truncated,
non-UTF-8 or non-object bodies; ``dump`` writes them, duplicate keys and raw literals
included) against a ``World`` (a fresh run with a saved version, gradients, a checkpoint and
an export); ``observe`` snapshots everything a request could change and ``check`` asserts the
invariants of one answer against the snapshot before it. ``STATS``/``KNOWN`` count outcomes
for the fuzz's summary; ``KNOWN_BUGS`` lists mock bugs recognised by signature.
``draw_headers`` and ``asgi_call`` do the same for headers (Content-Type variants, long and
non-ASCII ``X-Request-Id``, a ``Content-Length`` that lies, chunked bodies, two
``Authorization`` headers), sent straight into the ASGI app. Not a test module:
``from fuzz_support import ...``.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np
from conftest import ADAMW, API, BOS, MODEL, ce_datum, expect_error, new_run, text_tokens
from hypothesis import strategies as st

BODY_LIMIT = 64 * 1024
LIMITS = {"max_body_bytes": BODY_LIMIT, "max_datums_per_request": 4,
          "max_tokens_per_request": 256, "max_num_samples": 4, "max_sample_tokens": 16,
          "max_sessions": 100_000, "max_runs_per_session": 8, "max_versions_per_run": 64}
PRIMITIVES = ["forward", "forward_backward", "optim_step", "save_weights_for_sampler", "sample",
              "logprobs", "save_state", "load_state", "export_lora"]
LIFECYCLE = ["create_session", "heartbeat", "close_session", "create_run", "finish_run",
             "cancel_run"]
RECORDED_FAILURES = {"no_gradients", "version_conflict", "quota_exceeded", "version_not_found",
                     "checkpoint_not_found", "checkpoint_incompatible", "non_finite_loss",
                     "non_finite_update"}
PROBE = [BOS] + list(b"probe")
STATS: Counter[str] = Counter()
KNOWN: Counter[str] = Counter()
KNOWN_BUGS: dict[str, str] = {}  # signature -> the strict-xfail test that pins it down


class Raw:
    """Pre-serialised (possibly invalid) JSON text placed verbatim in a body."""

    def __init__(self, text: bytes) -> None:
        self.text = text

    def __repr__(self) -> str:
        return f"Raw({self.text[:40]!r})"


class Pairs(list[Any]):
    """An object as (key, value) pairs: lets a body carry a key twice."""


def dump(value: Any) -> bytes:
    if isinstance(value, Raw):
        return value.text
    if isinstance(value, Pairs):
        return b"{" + b",".join(dump(k) + b":" + dump(v) for k, v in value) + b"}"
    if isinstance(value, dict):
        return dump(Pairs(value.items()))
    if isinstance(value, list):
        return b"[" + b",".join(dump(v) for v in value) + b"]"
    if isinstance(value, float):
        return repr(value).encode()
    return json.dumps(value).encode()  # str (escaped), int, bool, None


def is_json(raw: bytes) -> bool | None:
    """RFC 8259 by the standard library (NaN/Infinity refused); None: either answer is allowed.

    RFC 8259 §9 lets a parser limit nesting depth; the mock's is orjson's (1024), beyond which
    a valid document is refused as 400 ``malformed_json``. Either answer is allowed there.
    """
    if raw.count(b"[") + raw.count(b"{") > 512:
        return None
    if not raw.strip():
        return True  # the contract reads an empty body as {} (schemas.Empty)
    try:
        document = json.loads(raw.decode("utf-8"), parse_constant=_refuse)
    except RecursionError:
        return None
    except ValueError:  # includes UnicodeDecodeError and JSONDecodeError
        return False
    try:  # RFC 8259 §8.2: an unpaired surrogate escape ("\ud800") parses, but what a receiver
        json.dumps(document, ensure_ascii=False).encode("utf-8")  # does with it is its choice
    except UnicodeEncodeError:
        return None
    return True


def _refuse(name: str) -> Any:
    raise ValueError(name)


# -- strategies -------------------------------------------------------------------------------
LITERALS = [b"NaN", b"-NaN", b"Infinity", b"-Infinity", b"1e999", b"-1e999", b"1E400",
            b"1e-400", b"-0", b"0e0", b"123456789012345678901234567890", b"01", b".5", b"+1",
            b"0x10", b"1_0", b"tru", b"nul", b'"\\ud800"', b'"\\udfff"', b'"\\u0000"']
BAD_UTF8 = [b"\xff", b"\xc3\x28", b"\xa0\xa1", b"\xe2\x28\xa1", b"\xf0\x28\x8c\xbc",
            b"\xed\xa0\x80", b"\xc0\xaf", b"\xef\xbb\xbf"]
hostile_values = st.one_of(
    st.integers(), st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([0, -1, 1, 2**31, 2**53 + 1, 2**63 - 1, 2**63, 2**64, -(2**63) - 1,
                     10**30, 10**400, 1e308, -1e308, 5e-324, -0.0, 1e-300]),
    st.sampled_from(LITERALS).map(Raw), st.booleans(), st.none(), st.text(max_size=8),
    st.lists(st.integers(-3, 300), max_size=4),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
    st.sampled_from([50, 1023, 1025, 5000]).map(lambda d: Raw(b"[" * d + b"]" * d)),
    st.just(Raw(b'"' + b"x" * (BODY_LIMIT + 10) + b'"')),
)

EXTREME_FLOATS = st.one_of(
    st.sampled_from([1e308, -1e308, 1.7976931348623157e308, 5e-324, -5e-324, 1e-300, 0.0,
                     -0.0, 1e30, -1e30, 0.9999999999999999, 1.0000000000000002]),
    st.floats(allow_nan=False, allow_infinity=False))
EXTREME_INTS = st.one_of(st.sampled_from([0, -1, 2**31, 2**53 + 1, 2**63 - 1, 2**63, 10**30]),
                         st.integers())


def nodes(tree: Any, path: tuple = ()) -> list[tuple]:
    """Paths to every dict/list container and leaf below ``tree``."""
    out = [path]
    if isinstance(tree, dict) and not isinstance(tree, Pairs):
        for key, value in tree.items():
            out += nodes(value, path + (key,))
    elif isinstance(tree, list) and not isinstance(tree, Pairs):
        for index, value in enumerate(tree):
            out += nodes(value, path + (index,))
    return out


def get(tree: Any, path: tuple) -> Any:
    for step in path:
        tree = tree[step]
    return tree


def put(tree: Any, path: tuple, value: Any) -> Any:
    if not path:
        return value
    get(tree, path[:-1])[path[-1]] = value
    return tree


def mutate(data: st.DataObject, tree: Any) -> Any:
    path = data.draw(st.sampled_from(nodes(tree)), label="path")
    node = get(tree, path)
    ops = ["replace"]
    if isinstance(node, dict) and not isinstance(node, Pairs):
        ops += ["unknown_key", "duplicate_key"] + (["delete"] if node else [])
    if isinstance(node, list) and not isinstance(node, Pairs):
        ops += ["empty", "giant"]
    op = data.draw(st.sampled_from(ops), label="op")
    if op == "replace":
        return put(tree, path, data.draw(hostile_values, label="value"))
    if op == "delete":
        del node[data.draw(st.sampled_from(sorted(node)), label="key")]
    elif op == "unknown_key":
        node[data.draw(st.text(min_size=1, max_size=12), label="key")] = \
            data.draw(hostile_values, label="value")
    elif op == "duplicate_key":
        key = data.draw(st.sampled_from(sorted(node)), label="key") if node else "seq"
        return put(tree, path, Pairs([*node.items(), (key, data.draw(hostile_values))]))
    elif op == "empty":
        node.clear()
    else:
        n = data.draw(st.sampled_from([100, 1000, 20_000]), label="n")
        return put(tree, path, (node or [1]) * (n // max(1, len(node))))
    return tree


# -- the run each example starts from ------------------------------------------------------------
class World:
    def __init__(self, client: httpx.Client) -> None:
        self.client = client
        self.run = new_run(client, rank=2, lora_seed=1)
        self.recorded: list[tuple[str, dict[str, Any]]] = [
            ("save_weights_for_sampler", {"seq": 1, "version": 0}),
            ("forward_backward", {"seq": 2, "loss_function": "cross_entropy", "loss_config": {},
                                  "data": [ce_datum(text_tokens("fuzz"))]}),
            ("save_state", {"seq": 3, "name": "ck"}),
            ("export_lora", {"seq": 4}),
        ]
        results = [self.run.ok(p, {k: v for k, v in b.items() if k != "seq"})
                   for p, b in self.recorded]
        self.checkpoint_id = results[2]["checkpoint_id"]
        self.export_id = results[3]["export_id"]

    def url(self, endpoint: str) -> str:
        if endpoint == "create_session":
            return f"{API}/sessions"
        if endpoint in ("heartbeat", "close_session", "create_run"):
            tail = {"heartbeat": "heartbeat", "close_session": "close", "create_run": "runs"}
            return f"{API}/sessions/{self.run.session_id}/{tail[endpoint]}"
        return self.run.url({"finish_run": "finish", "cancel_run": "cancel"}.get(endpoint,
                                                                                 endpoint))

    def valid_body(self, endpoint: str, seq: int) -> dict[str, Any]:
        sampling = {"max_tokens": 4, "temperature": 1.0, "top_k": 0, "top_p": 1.0, "seed": 1}
        rl: dict[str, Any] = {"model_input": {"token_ids": [BOS, 104, 105]},
              "loss_inputs": {"target_tokens": [104, 105, 33], "logprobs": [-5.0, -4.0, -3.0],
                              "advantages": [0.5, 0.5, 0.5], "mask": [0.0, 1.0, 1.0]}}
        bodies: dict[str, dict[str, Any]] = {
            "forward": {"seq": seq, "loss_function": "importance_sampling", "loss_config": {},
                        "data": [rl]},
            "forward_backward": {"seq": seq, "loss_function": "ppo",
                                 "loss_config": {"clip_low_threshold": 0.8}, "data": [rl]},
            "optim_step": {"seq": seq, "adamw": dict(ADAMW)},
            "save_weights_for_sampler": {"seq": seq, "version": 1},
            "sample": {"seq": seq, "version": 0, "prompt": {"token_ids": [BOS, 72]},
                       "num_samples": 2, "sampling": sampling},
            "logprobs": {"seq": seq, "version": 0, "token_ids": [BOS, 72, 105]},
            "save_state": {"seq": seq, "name": "fuzz"},
            "load_state": {"seq": seq, "checkpoint_id": self.checkpoint_id,
                           "with_optimizer": True},
            "export_lora": {"seq": seq},
            "create_session": {"ttl_seconds": 60, "metadata": {"k": "v"}},
            "create_run": {"base_model": MODEL, "lora": {"rank": 2, "alpha": 4.0, "seed": 3},
                           "optimizer": "adamw"},
        }
        return bodies.get(endpoint, {})


def observe(mock: Any, world: World) -> dict[str, Any]:
    """Everything a request could change, internal and over HTTP (bit-exact bytes)."""
    client = world.client
    http_run = client.get(world.run.url()).json()  # first: reading settles lazy time (LIFE-7)
    next_seq = http_run["next_seq"]
    backend = mock.backend
    run = backend.runs[world.run.run_id]
    session = backend.sessions[world.run.session_id]
    blob = lambda d: None if d is None else {k: a.tobytes() for k, a in d.items()}  # noqa: E731
    return {
        "state": run.state, "next_seq": next_seq, "step": run.step,
        "ops": {s: (o.primitive, o.status, o.payload) for s, o in run.ops.items()},
        "params": blob(run.lora.params), "grads": blob(run.grads),
        "m": blob(run.optimizer.m), "v": blob(run.optimizer.v), "t": run.optimizer.t,
        "versions": {n: (v.step, blob(v.lora.params)) for n, v in run.versions.items()},
        "exports": sorted(run.exports), "held": sorted(run.held),
        "session": (session.state, session.expires_at, session.metadata, list(session.run_ids)),
        "counts": (len(backend.sessions), len(backend.runs), len(backend.checkpoints)),
        "http_run": http_run,
        "http_last": client.get(world.run.url(f"operations/{next_seq - 1}")).content,
        "http_next": client.get(world.run.url(f"operations/{next_seq}")).status_code,
    }


TRAINING = ("state", "step", "params", "grads", "m", "v", "t", "versions", "exports", "held",
            "session", "counts")


def assert_same(before: dict, after: dict, keys: tuple[str, ...] | None = None) -> None:
    for key in keys or tuple(before):
        assert before[key] == after[key], f"{key} changed"


def finite_weights(mock: Any, world: World) -> bool:
    run = mock.backend.runs[world.run.run_id]
    arrays = [*run.lora.params.values(), *run.optimizer.m.values(), *run.optimizer.v.values()]
    return all(np.isfinite(a).all() for a in arrays)


class Crashes(logging.Handler):
    """Exceptions the mock logged while answering 500: shown when the fuzz finds one."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[BaseException] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info and record.exc_info[1] is not None:
            self.seen.append(record.exc_info[1])


def nulls_in(endpoint: str, result: Any) -> list[str]:
    """Where a 2xx result has null or a non-finite number (orjson writes inf/NaN as null).
    The contract's only null is ``logprobs[0]`` of the ``logprobs`` primitive."""
    found: list[str] = []

    def walk(value: Any, where: str) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                walk(item, f"{where}.{key}")
        elif isinstance(value, list):
            for index, item in enumerate(value):
                walk(item, f"{where}[{index}]")
        elif value is None or (isinstance(value, float) and not np.isfinite(value)):
            found.append(where)

    walk(result, "")
    return [w for w in found if not (endpoint == "logprobs" and w == ".logprobs[0]")]


def known_bug(mock: Any, endpoint: str, response: httpx.Response, world: World) -> str | None:
    if response.status_code == 200 and endpoint == "optim_step" \
            and (not finite_weights(mock, world) or nulls_in(endpoint, response.json())):
        return "optim-non-finite"
    return None


def check(mock: Any, world: World, endpoint: str, raw: bytes, response: httpx.Response,
          before: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """Assert the invariants of one request; returns (new state, keep going)."""
    STATS[f"status {response.status_code}"] += 1
    assert response.headers.get("X-Request-Id"), "TRANSPORT-1"
    crashes, mock.crashes.seen = mock.crashes.seen, []
    assert response.status_code < 500, (response.text, crashes)
    after = observe(mock, world)
    bug = known_bug(mock, endpoint, response, world)
    if bug:  # the run's weights may be NaN: nothing more to learn from it
        assert bug in KNOWN_BUGS, f"fixed mock bug {bug!r} is back: {response.text}"
        KNOWN[bug] += 1
        return after, False
    replayed = response.headers.get("Whitney-Replayed") == "true"
    if response.status_code >= 400:
        error = expect_error(response, response.status_code)
        assert response.status_code in (400, 404, 409, 413, 422), response.text
        json_ok = is_json(raw) if len(raw) <= BODY_LIMIT else None
        if len(raw) > BODY_LIMIT:
            assert response.status_code == 413, response.text
        if response.status_code == 413:
            assert len(raw) > BODY_LIMIT and error["type"] == "body_too_large"
        elif json_ok is not None:
            assert (response.status_code == 400) == (not json_ok), (raw[:200], response.text)
        if response.status_code == 400:
            assert error["type"] == "malformed_json"
        if endpoint in PRIMITIVES and not replayed and after["next_seq"] == before["next_seq"] + 1:
            seq = before["next_seq"]  # failed at its turn: recorded, nothing else moved (ORD-4)
            assert error["type"] in RECORDED_FAILURES, error
            record = world.client.get(world.run.url(f"operations/{seq}")).json()
            assert record["status"] == "failed" and record["error"] == error
            assert_same(before, after, TRAINING)
            STATS["recorded failures"] += 1
        else:
            assert_same(before, after)
            STATS["refused"] += 1
        return after, True
    if replayed:
        assert_same(before, after)
        STATS["replays"] += 1
    elif endpoint in PRIMITIVES:
        seq = before["next_seq"]
        assert after["next_seq"] == seq + 1
        assert after["ops"][seq][1] == 200 and after["ops"][seq][2] == response.content
        assert finite_weights(mock, world)
        assert not nulls_in(endpoint, response.json()), response.text
        STATS["executed"] += 1
    else:  # session and run lifecycle never touch training state (closing frees it: LIFE-3)
        if endpoint != "close_session":
            assert_same(before, after, ("next_seq", "ops", "step", "params", "grads", "m", "v",
                                        "t", "versions", "exports"))
        STATS["lifecycle ok"] += 1
    return after, True


def draw_request(data: st.DataObject, world: World, next_seq: int) -> tuple[str, str, bytes]:
    endpoint = data.draw(st.sampled_from(PRIMITIVES * 3 + LIFECYCLE), label="endpoint")
    url = world.url(endpoint)
    body = world.valid_body(endpoint, next_seq)
    kind = data.draw(st.sampled_from(["mutate", "mutate", "extreme", "extreme", "seq", "raw",
                                      "truncate", "utf8", "non_object"]), label="kind")
    if kind == "raw":
        return endpoint, url, data.draw(st.binary(max_size=64), label="raw")
    if kind == "non_object":
        return endpoint, url, data.draw(st.sampled_from(
            [b"[]", b"null", b"1", b'"x"', b"true", b"[{}]", b"{}", b"", b"  \n"]))
    if kind == "truncate":
        text = dump(body)
        return endpoint, url, text[:data.draw(st.integers(0, max(0, len(text) - 1)))]
    if kind == "utf8":
        bad = data.draw(st.sampled_from(BAD_UTF8), label="bytes")
        body[data.draw(st.sampled_from(["name", "zz", "base_model", "loss_function"]))] = \
            Raw(b'"a' + bad + b'b"')
        return endpoint, url, dump(body)
    if kind == "seq" and endpoint in PRIMITIVES:
        how = data.draw(st.sampled_from(["future", "replay", "conflict", "value", "missing"]))
        if how == "replay":  # the exact recorded body of an earlier seq: ORD-3
            primitive, recorded = world.recorded[data.draw(st.integers(0, 3))]
            return primitive, world.url(primitive), dump(recorded)
        if how == "future":  # held, then 409 seq_gap after order_wait_ms (20 ms)
            body["seq"] = next_seq + data.draw(st.integers(1, 3))
        elif how == "conflict":
            body["seq"] = data.draw(st.integers(1, next_seq - 1))
        elif how == "missing":
            del body["seq"]
        else:
            body["seq"] = data.draw(hostile_values, label="seq")
        return endpoint, url, dump(body)
    if kind == "extreme":  # right JSON type, extreme value: these reach their turn
        leaves = [p for p in nodes(body) if p and p[-1] != "seq"
                  and type(get(body, p)) in (int, float)]
        for path in data.draw(st.lists(st.sampled_from(leaves), min_size=1, max_size=3,
                                       unique=True), label="leaves") if leaves else []:
            value = data.draw(EXTREME_FLOATS if isinstance(get(body, path), float)
                              else EXTREME_INTS, label="value")
            put(body, path, value)
        return endpoint, url, dump(body)
    for _ in range(data.draw(st.integers(1, 3), label="mutations")):
        body = mutate(data, body)
    return endpoint, url, dump(body)


# -- hostile headers (issue 14): driven at the ASGI level, so every byte is ours ------------------
CONTENT_TYPES: list[bytes | None] = [
    None, b"application/json", b"application/json; charset=utf-8", b"APPLICATION/JSON",
    b"text/plain", b"application/x-www-form-urlencoded", b"multipart/form-data; boundary=zz",
    b"application/json; charset=latin-1", b"", b"\xff\xfe/\x00", b"application/problem+json"]
REQUEST_IDS: list[bytes | None] = [
    None, b"", b"r" * 5000, "caf\u00e9-\u2713".encode("utf-8"), b"\xff\xfe\x80id",
    b"a b\tc", b"x" * 199 + "\u00e9".encode("utf-8"), b"0" * 200]
CONTENT_LENGTHS = ["exact", "none", "short", "long", "huge", "text", "negative", "twice"]
AUTHORIZATIONS = ["one", "none", "two_same", "two_valid_first", "two_valid_second"]


@dataclass
class RawReply:
    """What the app answered one ASGI request: status, raw header pairs, body."""

    status: int
    headers: list[tuple[bytes, bytes]]
    content: bytes

    def header(self, name: bytes) -> list[bytes]:
        return [v for k, v in self.headers if k.lower() == name]

    def as_httpx(self) -> httpx.Response:
        return httpx.Response(self.status, headers=self.headers, content=self.content)


async def asgi_call(app: Any, method: str, path: str, headers: list[tuple[bytes, bytes]],
                    chunks: list[bytes]) -> RawReply:
    """One request straight into the ASGI app: ``headers`` exactly as given (duplicates,
    non-ASCII bytes, a lying Content-Length), the body as ``chunks`` (http.request messages
    with more_body, as a chunked transfer arrives)."""
    messages = [{"type": "http.request", "body": chunk, "more_body": i < len(chunks) - 1}
                for i, chunk in enumerate(chunks)] or [{"type": "http.request", "body": b""}]
    pending = list(messages)
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        if pending:
            return pending.pop(0)
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": method, "scheme": "http", "path": path, "raw_path": path.encode(),
             "query_string": b"", "root_path": "", "headers": headers,
             "client": ("127.0.0.1", 5000), "server": ("mock", 80)}
    await app(scope, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return RawReply(start["status"], list(start.get("headers", [])), body)


def draw_headers(data: st.DataObject, raw: bytes, key: str
                 ) -> tuple[list[tuple[bytes, bytes]], list[bytes], dict[str, Any]]:
    """Hostile headers and a chunking for a body ``raw``; also what was drawn."""
    drawn = {
        "content_type": data.draw(st.sampled_from(CONTENT_TYPES), label="content-type"),
        "request_id": data.draw(st.sampled_from(REQUEST_IDS) | st.binary(max_size=300),
                                label="x-request-id"),
        "content_length": data.draw(st.sampled_from(CONTENT_LENGTHS), label="content-length"),
        # mostly the one right header, so the others' effects show past SEC-1
        "authorization": data.draw(st.sampled_from(["one"] * 8 + AUTHORIZATIONS[1:]),
                                   label="authorization"),
        "chunks": data.draw(st.integers(1, 6), label="chunks"),
    }
    bearer = f"Bearer {key}".encode()
    headers: list[tuple[bytes, bytes]] = []
    auth = drawn["authorization"]
    if auth == "one":
        headers.append((b"authorization", bearer))
    elif auth == "two_same":
        headers += [(b"authorization", bearer), (b"authorization", bearer)]
    elif auth == "two_valid_first":
        headers += [(b"authorization", bearer), (b"authorization", b"Bearer someone-else")]
    elif auth == "two_valid_second":
        headers += [(b"authorization", b"Bearer someone-else"), (b"authorization", bearer)]
    if drawn["content_type"] is not None:
        headers.append((b"content-type", drawn["content_type"]))
    if drawn["request_id"] is not None:
        headers.append((b"x-request-id", drawn["request_id"]))
    lengths = {"exact": str(len(raw)).encode(), "short": str(max(0, len(raw) - 3)).encode(),
               "long": str(len(raw) + 1000).encode(), "huge": str(BODY_LIMIT * 10).encode(),
               "text": b"twelve", "negative": b"-1"}
    how = drawn["content_length"]
    if how in lengths:
        headers.append((b"content-length", lengths[how]))
    elif how == "twice":
        headers += [(b"content-length", str(len(raw)).encode()), (b"content-length", b"7")]
    n = drawn["chunks"]
    cuts = sorted(data.draw(st.lists(st.integers(0, len(raw)), min_size=n - 1,
                                     max_size=n - 1), label="cuts"))
    chunks = [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)], strict=False)]
    return headers, chunks, drawn
