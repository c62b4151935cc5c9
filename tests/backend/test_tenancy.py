"""Tenancy and auth (SEC-1, SEC-2) over every path of ``openapi.yaml``, and the CLI's bind.

- SEC-1: every contract path answers 401 in the ERR-1 envelope to a missing key and to wrong
  keys that share the real key's length and prefix; nothing changes.
- Keys are compared in constant time: ``Backend.authenticate`` runs ``hmac.compare_digest``
  against EVERY configured key whatever the outcome (no early exit on a match, no ``==`` on
  secrets), so the time taken does not depend on how many leading bytes of a guess are right
  or on which tenant's key it is. A test can only observe behaviour, so
  ``test_sec_1_every_key_is_compared_with_compare_digest_whatever_the_outcome`` spies on the
  comparisons made; the rest is the property of ``compare_digest`` itself (it leaks only the
  length of the compared values).
- SEC-2: the path walk loads ``openapi.yaml``, fills every path parameter with an id created by
  key A (session, run, operation seq, export id and file name), calls it with key B and
  expects 404 with the same ``error.type`` a nonexistent id gets, and A's state bit for bit
  unchanged. Ids carried in bodies (checkpoint ids, export ids, versions) are checked from B's
  own run.
- The CLI binds 127.0.0.1 by default and warns on any other interface (checked without binding:
  ``uvicorn.run`` is replaced by a recorder).
"""

from __future__ import annotations

import hmac
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from conftest import (
    ADAMW,
    API,
    BOS,
    KEY,
    MODEL,
    OTHER_KEY,
    assert_same_state,
    ce_datum,
    expect_error,
    new_run,
    state_snapshot,
    text_tokens,
)

import mock_server.__main__ as cli
from mock_server import Backend

SPEC_PATH = Path(__file__).resolve().parents[2] / "openapi.yaml"
SPEC = yaml.safe_load(SPEC_PATH.read_text())
METHODS = ("get", "post", "put", "patch", "delete")
CONTRACT_OPERATIONS = sorted(
    (method.upper(), path, operation.get("operationId", f"{method} {path}"))
    for path, item in SPEC["paths"].items() if path.startswith(API + "/")
    for method, operation in item.items() if method in METHODS)
PARAM = re.compile(r"{([^}]+)}")
WITH_IDS = [op for op in CONTRACT_OPERATIONS if PARAM.search(op[1])]

# Same length as KEY ("test-key-1") and as OTHER_KEY, sharing all but the last byte, or all
# but the first: a timing-unsafe comparison would take longest on exactly these.
WRONG_KEYS = [KEY[:-1] + "9", "x" + KEY[1:], KEY.upper(), KEY + "1", KEY[:-1]]
# Header values are bytes on the wire: a non-ASCII byte must not crash the comparison.
WRONG_AUTHORIZATIONS = [None, *(f"Bearer {k}".encode() for k in WRONG_KEYS),
                        b"Bearer " + KEY[:-1].encode() + b"\xe9", b"Bearer \xff\xfe",
                        f"Basic {KEY}".encode(), f"Bearer{KEY}".encode(), KEY.encode()]


def test_the_walk_covers_the_contract():
    """Guard against a silently empty parametrisation: the spec has the contract's paths."""
    paths = {path for _, path, _ in CONTRACT_OPERATIONS}
    assert f"{API}/runs/{{run_id}}/operations/{{seq}}" in paths
    assert f"{API}/runs/{{run_id}}/exports/{{export_id}}/{{name}}" in paths
    assert len(WITH_IDS) >= 18, WITH_IDS


# -- the world key A builds, and what it must look like after B's requests ---------------------
class World:
    """Key A: a session with one run that has a saved version, accumulated gradients, a
    checkpoint and an export. Key B: its own session and run."""

    def __init__(self, mock: Any) -> None:
        self.mock = mock
        self.a, self.b = mock.client(KEY), mock.client(OTHER_KEY)
        self.run_a = new_run(self.a)
        self.run_a.save(0)
        self.run_a.forward_backward([ce_datum(text_tokens("tenant A"))])
        self.checkpoint_id = self.run_a.ok("save_state", {"name": "a"})["checkpoint_id"]
        self.export_id = self.run_a.ok("export_lora")["export_id"]
        self.run_b = new_run(self.b)
        self.ids = {"session_id": self.run_a.session_id, "run_id": self.run_a.run_id,
                    "seq": "1", "export_id": self.export_id, "name": "adapter_model.safetensors"}
        self.unknown = {"session_id": "sess_000999ffffffffffff",
                        "run_id": "run_000999ffffffffffff", "seq": "1",
                        "export_id": "exp_000999ffffffffffff",
                        "name": "adapter_model.safetensors"}

    def snapshot(self) -> dict[str, Any]:
        backend = self.mock.backend
        run = backend.runs[self.run_a.run_id]
        session = backend.sessions[self.run_a.session_id]
        return {
            "run": state_snapshot(backend, self.run_a.run_id),
            "session": (session.state, session.expires_at, dict(session.metadata),
                        list(session.run_ids)),
            "ops": {seq: (op.primitive, op.status, op.payload) for seq, op in run.ops.items()},
            "export_files": {eid: dict(e.files) for eid, e in run.exports.items()},
            "checkpoints": sorted(backend.checkpoints),
            "counts": (len(backend.sessions), len(backend.runs)),
            "held": dict(run.held),
        }

    def assert_unchanged(self, before: dict[str, Any]) -> None:
        after = self.snapshot()
        assert_same_state(before["run"], after["run"])
        for key in ("session", "ops", "export_files", "checkpoints", "counts", "held"):
            assert before[key] == after[key], key


def valid_body(operation_id: str, world: World) -> dict[str, Any] | None:
    """A body that would succeed (or at least pass validation) for the OWNER, so a 404 can only
    come from the ownership check. ``None`` for GET."""
    seq = world.mock.backend.runs[world.run_a.run_id].next_seq
    sampling = {"max_tokens": 2, "temperature": 1.0, "top_k": 0, "top_p": 1.0, "seed": 1}
    bodies: dict[str, dict[str, Any]] = {
        "heartbeat_session": {}, "close_session": {}, "finish_run": {}, "cancel_run": {},
        "create_run": {"base_model": MODEL, "lora": {"rank": 2, "alpha": 4.0},
                       "optimizer": "adamw"},
        "forward": {"seq": seq, "loss_function": "cross_entropy", "loss_config": {},
                    "data": [ce_datum(text_tokens("B"))]},
        "forward_backward": {"seq": seq, "loss_function": "cross_entropy", "loss_config": {},
                             "data": [ce_datum(text_tokens("B"))]},
        "optim_step": {"seq": seq, "adamw": ADAMW},
        "save_weights_for_sampler": {"seq": seq, "version": 1},
        "sample": {"seq": seq, "version": 0, "prompt": {"token_ids": [BOS, 66]},
                   "num_samples": 1, "sampling": sampling},
        "logprobs": {"seq": seq, "version": 0, "token_ids": [BOS, 66, 67]},
        "save_state": {"seq": seq, "name": "stolen"},
        "load_state": {"seq": seq, "checkpoint_id": world.checkpoint_id, "with_optimizer": True},
        "export_lora": {"seq": seq},
    }
    return bodies.get(operation_id)


def fill(path: str, values: dict[str, str]) -> str:
    def one(match: re.Match[str]) -> str:
        name = match.group(1)
        assert name in values, f"openapi path parameter {{{name}}} has no test id: add one"
        return values[name]

    return PARAM.sub(one, path)


@pytest.mark.parametrize("method,path,operation_id", WITH_IDS,
                         ids=[op[2] for op in WITH_IDS])
def test_sec_2_foreign_key_gets_404_like_a_nonexistent_id_on_every_path(
        mock, method, path, operation_id):
    world = World(mock)
    body = valid_body(operation_id, world)
    assert method == "GET" or body is not None, f"no valid body for {operation_id}: add one"
    kwargs = {} if body is None else {"json": body}
    before = world.snapshot()

    foreign = world.b.request(method, fill(path, world.ids), **kwargs)
    unknown = world.b.request(method, fill(path, world.unknown), **kwargs)

    foreign_error = expect_error(foreign, 404)
    unknown_error = expect_error(unknown, 404)
    assert foreign_error["type"] == unknown_error["type"]
    assert foreign_error["details"].keys() == unknown_error["details"].keys()
    # The answer does not leak what the resource holds (no recorded result, no file bytes).
    assert foreign.headers.get("Whitney-Replayed") is None
    world.assert_unchanged(before)
    # And the owner still sees it exactly as before.
    owner = world.a.request(method, fill(path, world.ids), **kwargs) if method == "GET" else None
    if owner is not None:
        assert owner.status_code == 200, owner.text


def test_sec_2_replay_of_a_recorded_seq_is_404_for_a_foreign_key(mock):
    """ORD-3 must not become a side channel: the recorded answer of A's seq 1 is not served."""
    world = World(mock)
    before = world.snapshot()
    url = world.run_a.url("save_weights_for_sampler")
    expect_error(world.b.post(url, json={"seq": 1, "version": 0}), 404)
    world.assert_unchanged(before)
    replay = world.a.post(url, json={"seq": 1, "version": 0})
    assert replay.status_code == 200 and replay.headers["Whitney-Replayed"] == "true"


def test_sec_2_ids_inside_bodies_resolve_only_for_their_owner(mock):
    """Checkpoint ids, export ids and version numbers of A mean nothing on B's own run: the
    same answer as a nonexistent id, and only B's run moves (its seq accounting, ORD-4)."""
    world = World(mock)
    before_a = world.snapshot()
    run_b = world.run_b
    cases = [
        ("load_state", {"checkpoint_id": world.checkpoint_id, "with_optimizer": True},
         {"checkpoint_id": "ckpt_000999ffffffffffff", "with_optimizer": True}),
        ("logprobs", {"version": 0, "token_ids": [BOS, 66]},
         {"version": 77, "token_ids": [BOS, 66]}),
    ]
    for primitive, foreign_body, unknown_body in cases:
        snap = state_snapshot(mock.backend, run_b.run_id)
        foreign = expect_error(run_b.post(primitive, foreign_body), 404)
        unknown = expect_error(run_b.post(primitive, unknown_body), 404)
        assert foreign["type"] == unknown["type"]
        after = state_snapshot(mock.backend, run_b.run_id)
        assert after["next_seq"] == snap["next_seq"] + 2  # both recorded as failed (ORD-4)
        after["next_seq"], after["ops"] = snap["next_seq"], snap["ops"]
        assert_same_state(snap, after)
    for tail in (f"exports/{world.export_id}/adapter_model.safetensors",
                 f"exports/{world.export_id}/adapter_config.json"):
        foreign = expect_error(world.b.get(run_b.url(tail)), 404)
        unknown = expect_error(world.b.get(run_b.url(tail.replace(world.export_id,
                                                                   "exp_000999ffffffffffff"))),
                               404)
        assert foreign["type"] == unknown["type"]
    world.assert_unchanged(before_a)


# -- SEC-1 on every path -----------------------------------------------------------------------
@pytest.mark.parametrize("method,path,operation_id", CONTRACT_OPERATIONS,
                         ids=[op[2] for op in CONTRACT_OPERATIONS])
def test_sec_1_wrong_keys_of_the_same_shape_get_401_on_every_path(mock, method, path,
                                                                 operation_id):
    world = World(mock)
    body = valid_body(operation_id, world) if method != "GET" else None
    if operation_id == "create_session":
        body = {}
    kwargs = {} if body is None else {"json": body}
    url = fill(path, world.ids)
    before = world.snapshot()
    for authorization in WRONG_AUTHORIZATIONS:
        headers = {} if authorization is None else {"Authorization": authorization}
        anonymous = httpx.Client(transport=mock.transport, base_url="http://mock",
                                 headers=headers)
        expect_error(anonymous.request(method, url, **kwargs), 401)
    world.assert_unchanged(before)


def test_sec_1_scheme_is_case_insensitive_and_the_right_key_works(mock):
    """RFC 9110 §11.1: the auth scheme is case-insensitive; the token is not."""
    for scheme in ("Bearer", "bearer", "BEARER"):
        client = httpx.Client(transport=mock.transport, base_url="http://mock",
                              headers={"Authorization": f"{scheme} {KEY}"})
        assert client.get(f"{API}/capabilities").status_code == 200


def test_sec_1_every_key_is_compared_with_compare_digest_whatever_the_outcome(monkeypatch):
    keys = ("k-first-0000", "k-middle-000", "k-last-00000")
    backend = Backend(api_keys=keys)
    calls: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a: Any, b: Any) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)
    for token, expected in [(keys[0], keys[0]), (keys[2], keys[2]), ("k-last-00001", None),
                            ("k-first-000", None), ("", None)]:
        calls.clear()
        if expected is None:
            with pytest.raises(Exception) as raised:
                backend.authenticate(f"Bearer {token}")
            assert getattr(raised.value, "status", None) == 401
        else:
            assert backend.authenticate(f"Bearer {token}") == expected
        # One constant-time comparison per configured key: no early exit on a match.
        guess = token.encode()
        compared = sorted(b if a == guess else a for a, b in calls)  # the side that is not it
        assert compared == sorted(k.encode() for k in keys), token


# -- the CLI's bind ------------------------------------------------------------------------------
@pytest.fixture
def fake_uvicorn(monkeypatch):
    import logging

    import uvicorn

    # main() configures the mock_server loggers for a terminal (handler on this test's captured
    # stderr, no propagation): undo it, or later tests' caplog sees no request lines.
    logger = logging.getLogger("mock_server")
    monkeypatch.setattr(logger, "handlers", list(logger.handlers))
    monkeypatch.setattr(logger, "propagate", logger.propagate)
    monkeypatch.setattr(logger, "level", logger.level)

    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kwargs: calls.append(kwargs))
    monkeypatch.delenv("WHITNEY_MOCK_API_KEYS", raising=False)
    return calls


def test_cli_default_bind_is_loopback(fake_uvicorn, capsys):
    assert cli.build_parser().parse_args([]).host == "127.0.0.1"
    assert cli.main([]) == 0
    assert fake_uvicorn[0]["host"] == "127.0.0.1"
    assert "WARNING" not in capsys.readouterr().err


@pytest.mark.parametrize("host", ["127.0.0.1", "127.8.9.10", "::1", "localhost"])
def test_cli_loopback_hosts_do_not_warn(fake_uvicorn, capsys, host):
    cli.main(["--host", host, "--port", "0"])
    assert fake_uvicorn[0]["host"] == host
    assert "WARNING" not in capsys.readouterr().err


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.20", "10.0.0.1", "example.com"])
def test_cli_other_interfaces_print_a_warning(fake_uvicorn, capsys, host):
    cli.main(["--host", host, "--port", "0"])
    assert fake_uvicorn[0]["host"] == host  # it still serves: the warning is the guard
    err = capsys.readouterr().err
    assert "WARNING" in err and host in err and "loopback" in err


def test_cli_banner_does_not_print_a_long_key_in_full(fake_uvicorn, capsys):
    secret = "sk-live-0123456789abcdef"
    cli.main(["--api-key", secret])
    out = capsys.readouterr()
    assert secret not in out.out and secret not in out.err
