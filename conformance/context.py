"""What a check receives: the wire, the capabilities, and handles for sessions and runs.

Checks create every resource through :class:`Ctx` (``ctx.session()``, ``ctx.run()``), which
tags sessions with the suite's run id and ends them when the check returns or raises. The
per-run ``seq`` bookkeeping lives in :class:`RunHandle`: a request consumes its seq exactly
when the contract says it is recorded (ORD-4), so checks can send the next seq without
re-reading the run.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .options import Options
from .payloads import adamw, ce_datum, loss_body, sampling
from .registry import CheckFailed, CheckUnsupported, CheckWarning
from .wire import PRIMARY, TERMINAL, Reply, Wire

__all__ = ["Ctx", "RunHandle", "SessionHandle", "Held", "RECORDED_FAILURES", "contract_view",
           "same_view",
           "expect_status", "close", "assert_close", "assert_moved", "assert_json_close"]

# error.type values raised at a primitive's turn: recorded, consuming the seq (ORD-4, 4a).
RECORDED_FAILURES = frozenset({"no_gradients", "version_conflict", "version_not_found",
                               "quota_exceeded", "checkpoint_not_found"})


# The fields LIFE-1 and LIFE-5 define for the session and run views. Views are compared on these
# only: a server may add fields (EXT-1), and an added field may change from one read to the next.
SESSION_FIELDS = ("session_id", "state", "created_at", "expires_at", "metadata")
RUN_FIELDS = ("run_id", "session_id", "state", "next_seq", "step", "versions", "created_at")
VERSION_FIELDS = ("version", "step", "created_at")


def contract_view(view: Any) -> Any:
    """A session or run view reduced to the fields the contract defines (EXT-1)."""
    if not isinstance(view, dict):
        return view
    fields = RUN_FIELDS if "run_id" in view else SESSION_FIELDS
    out = {key: view.get(key) for key in fields}
    versions = out.get("versions")
    if isinstance(versions, list) and "run_id" in view:
        out["versions"] = [{k: v.get(k) for k in VERSION_FIELDS} if isinstance(v, dict) else v
                           for v in versions]
    return out


def same_view(a: Any, b: Any) -> bool:
    """Two session or run views agree on every field the contract defines."""
    return bool(contract_view(a) == contract_view(b))


def expect_status(reply: Reply, status: int, error_type: str | None = None,
                  what: str = "") -> Reply:
    """Fail unless ``reply`` has ``status`` (and ``error.type`` when given)."""
    ok = reply.status == status and (error_type is None or reply.error_type == error_type)
    if not ok:
        want = f"{status}" + (f" {error_type}" if error_type else "")
        prefix = f"{what}: " if what else ""
        raise CheckFailed(f"{prefix}expected {want}, got {reply.describe()}")
    return reply


def close(a: float, b: float, tol: float, rel: float = 0.0) -> bool:
    return math.isfinite(a) and math.isfinite(b) and abs(a - b) <= tol + rel * max(abs(a), abs(b))


def assert_close(actual: Iterable[float] | float, expected: Iterable[float] | float, tol: float,
                 what: str, rel: float = 0.0) -> None:
    """Elementwise |a - b| <= tol + rel·max(|a|, |b|), with a precise failure message."""
    if isinstance(actual, (int, float)) and isinstance(expected, (int, float)):
        if not close(float(actual), float(expected), tol, rel):
            raise CheckFailed(f"{what}: got {actual!r}, expected {expected!r} (tol {tol:g}"
                              + (f", rel {rel:g})" if rel else ")"))
        return
    actual_list, expected_list = list(actual), list(expected)  # type: ignore[arg-type]
    if len(actual_list) != len(expected_list):
        raise CheckFailed(f"{what}: {len(actual_list)} values, expected {len(expected_list)}")
    for i, (a, b) in enumerate(zip(actual_list, expected_list, strict=False)):
        if a is None or b is None:
            if a is not b:
                raise CheckFailed(f"{what}[{i}]: got {a!r}, expected {b!r}")
            continue
        if not close(float(a), float(b), tol, rel):
            raise CheckFailed(f"{what}[{i}]: got {a!r}, expected {b!r} (tol {tol:g})")


def assert_moved(after: Iterable[float], before: Iterable[float], tol: float, what: str) -> None:
    """The observable responds: ``after`` differs from ``before`` by more than ten times the
    tolerance. Every check that asserts an invariance (two things equal) also asserts this,
    so that a server ignoring its input (answering the same thing always) cannot pass it."""
    pairs = [(a, b) for a, b in zip(after, before, strict=False) if a is not None and b is not None]
    moved = max((abs(float(a) - float(b)) for a, b in pairs), default=0.0)
    if not moved > 10 * tol:
        raise CheckFailed(f"{what}: the logprobs changed by {moved:g} only (tolerance {tol:g}); "
                          f"the equalities checked here would hold for a server that ignores "
                          f"its input")


def assert_json_close(actual: Any, expected: Any, tol: float, what: str) -> None:
    """Structural equality of two JSON values, floats within ``tol`` (absolute + relative)."""
    if isinstance(expected, dict):
        if not isinstance(actual, dict) or set(actual) != set(expected):
            shown = sorted(actual) if isinstance(actual, dict) else actual
            raise CheckFailed(f"{what}: keys {shown!r}"
                              f" != {sorted(expected)}")
        for key in expected:
            assert_json_close(actual[key], expected[key], tol, f"{what}.{key}")
    elif isinstance(expected, list):
        if not isinstance(actual, list) or len(actual) != len(expected):
            raise CheckFailed(f"{what}: {actual!r} != {expected!r}")
        for i, (a, b) in enumerate(zip(actual, expected, strict=False)):
            assert_json_close(a, b, tol, f"{what}[{i}]")
    elif isinstance(expected, float) and isinstance(actual, (int, float)) \
            and not isinstance(actual, bool):
        if not close(float(actual), expected, tol, rel=tol):
            raise CheckFailed(f"{what}: {actual!r} != {expected!r} (tol {tol:g})")
    elif actual != expected or type(actual) is not type(expected):
        raise CheckFailed(f"{what}: {actual!r} != {expected!r}")


class RunHandle:
    """A run under test and its next ``seq``."""

    def __init__(self, ctx: Ctx, view: dict[str, Any], auth: str = PRIMARY) -> None:
        self.ctx = ctx
        self.view = view
        self.id: str = view["run_id"]
        self.session_id: str = view["session_id"]
        self.auth = auth
        self.seq = int(view.get("next_seq", 1))

    def prim(self, name: str, body: dict[str, Any] | None = None, *, seq: int | None = None,
             expect: int | tuple[int, str] | None = 200, raw: bytes | None = None,
             auth: str | None = None, headers: dict[str, str] | None = None) -> Reply:
        """Send primitive ``name``; ``seq`` defaults to the handle's next seq and is added to
        ``body``. The handle advances when the reply is recorded (200 or a recorded failure).
        """
        use_seq = self.seq if seq is None else seq
        payload = None if raw is not None else {"seq": use_seq, **(body or {})}
        path = f"/runs/{self.id}/{name}"
        if raw is not None:
            reply = self.ctx.wire.call("POST", path, content=raw, auth=auth or self.auth,
                                       headers=headers)
        else:
            reply = self.ctx.wire.call("POST", path, payload, auth=auth or self.auth,
                                       headers=headers)
        recorded = reply.status == 200 or reply.error_type in RECORDED_FAILURES
        if recorded and use_seq == self.seq and not reply.replayed:
            self.seq += 1
        if expect is not None:
            status, etype = (expect, None) if isinstance(expect, int) else expect
            expect_status(reply, status, etype, what=f"{name} seq {use_seq}")
        return reply

    def body(self, name: str, body: dict[str, Any] | None = None, **kwargs: Any) -> dict[str, Any]:
        """Send ``name`` expecting 200 and return the parsed body."""
        reply: dict[str, Any] = self.prim(name, body, **kwargs).body
        return reply

    def forward(self, data: list[dict[str, Any]], loss: str = "cross_entropy",
                config: dict[str, Any] | None = None, *, backward: bool = False,
                **kwargs: Any) -> dict[str, Any]:
        """A valid ``forward`` / ``forward_backward`` (within the server's limits, else the
        check warns that it could not run); its 200 body."""
        self.ctx.fits(data)
        return self.body("forward_backward" if backward else "forward",
                         loss_body(data, loss, config), **kwargs)

    def score(self, tokens: list[int]) -> list[float]:
        """``forward`` logprobs of ``tokens[1:]`` after their prefixes (training weights)."""
        logprobs: list[float] = self.forward([ce_datum(tokens)])["outputs"][0]["logprobs"]
        return logprobs

    def step(self, **overrides: Any) -> dict[str, Any]:
        """``optim_step`` with the suite's AdamW (``payloads.adamw``) and ``overrides``."""
        return self.body("optim_step", {"adamw": adamw(**overrides)})

    def train(self, tokens: list[int], **overrides: Any) -> dict[str, Any]:
        """One cross_entropy ``forward_backward`` on ``tokens``, then :meth:`step`."""
        self.forward([ce_datum(tokens)], backward=True)
        return self.step(**overrides)

    def save(self, version: int) -> dict[str, Any]:
        return self.body("save_weights_for_sampler", {"version": version})

    def get(self, auth: str | None = None) -> dict[str, Any]:
        reply = self.ctx.wire.call("GET", f"/runs/{self.id}", auth=auth or self.auth)
        self.view = expect_status(reply, 200, what=f"GET run {self.id}").body
        return self.view

    def wait_terminal(self, timeout: float = 10.0) -> dict[str, Any]:
        """Poll ``GET /runs/{rid}`` until a terminal state (LIFE-7); the terminal view."""
        state = self.ctx.wire.wait_terminal(self.id, self.auth, timeout)
        if state not in TERMINAL:
            raise CheckFailed(f"run {self.id} still {state!r} after {timeout}s")
        return self.get()


class Held:
    """A request sent on a helper thread ahead of its turn, so the server should hold it
    (ORD-2) while the check acts. ``was_held``: still waiting after the pause."""

    def __init__(self, send: Callable[[], Reply], pause: float) -> None:
        self.reply: Reply | None = None
        self.answered_after: float | None = None
        self._error: BaseException | None = None
        self._sent_at = time.monotonic()
        self._thread = threading.Thread(target=self._send, args=(send,), daemon=True)
        self._thread.start()
        time.sleep(pause)
        self.was_held = self._thread.is_alive()

    def _send(self, send: Callable[[], Reply]) -> None:
        try:
            self.reply = send()
        except BaseException as exc:  # noqa: BLE001 - re-raised by result()
            self._error = exc
        finally:
            self.answered_after = time.monotonic() - self._sent_at

    def result(self, timeout: float = 30.0) -> Reply:
        """The answer, once it came (re-raising what the sending thread raised)."""
        self._thread.join(timeout)
        if self._error is not None:
            raise self._error
        if self.reply is None:
            raise CheckFailed(f"a held request got no answer within {timeout} s")
        return self.reply

    def not_held(self, clause: str) -> CheckWarning:
        """The warning for a clause that needs a held request when the server answered it
        instead: says what the server did."""
        reply = self.result()
        answer = f"{reply.status} {reply.error_type}" if reply.error_type else str(reply.status)
        return CheckWarning(
            f"{clause} not exercised: the server did not hold {reply.method} {reply.path} (sent "
            f"ahead of its turn) but answered {answer} after {self.answered_after or 0.0:.3f} s "
            f"(see ORD-2)")


class SessionHandle:
    def __init__(self, ctx: Ctx, view: dict[str, Any], auth: str) -> None:
        self.ctx = ctx
        self.view = view
        self.id: str = view["session_id"]
        self.auth = auth
        self.runs: list[RunHandle] = []


@dataclass
class Ctx:
    """Per-suite state shared by checks (capabilities are read once)."""

    wire: Wire
    run_tag: str
    options: Options = field(default_factory=Options)
    caps: dict[str, Any] = field(default_factory=dict)
    check_id: str = "(suite)"
    strict_findings: list[str] = field(default_factory=list)
    deadline: float | None = None  # time.monotonic() at which --max-duration ends the run
    progress: Callable[[str], None] | None = None
    _sessions: list[SessionHandle] = field(default_factory=list)
    _rtt: float | None = None

    @property
    def strict(self) -> bool:
        """Whether the run also checks the mock's exact shapes (``--profile strict``)."""
        return self.options.profile == "strict"

    def strict_only(self, finding: str) -> None:
        """Note a difference from the mock's exact behaviour that the contract allows (EXT-1):
        reported under ``--profile strict`` as a strict-only finding, never a failure."""
        self.strict_findings.append(finding)

    # ---------------------------------------------------------------- capabilities
    @property
    def base_model(self) -> dict[str, Any]:
        models = self.caps.get("base_models") or []
        if not models:
            raise CheckUnsupported("capabilities declare no base model")
        model: dict[str, Any] = models[0]
        return model

    @property
    def vocab(self) -> int:
        return int(self.base_model["vocab_size"])

    @property
    def eos(self) -> int:
        return int(self.base_model["eos_token_id"])

    @property
    def limits(self) -> dict[str, Any]:
        return self.caps.get("limits") or {}

    @property
    def tol(self) -> float:
        return float((self.caps.get("features") or {}).get("logprob_tolerance", 1e-4))

    def losses(self) -> dict[str, Any]:
        return self.caps.get("loss_functions") or {}

    def has_loss(self, name: str) -> bool:
        return name in self.losses()

    def has_primitive(self, name: str) -> bool:
        return name in (self.caps.get("primitives") or [])

    def declares(self, capability: str) -> bool:
        """Whether a dotted capability path is declared (see ``registry.check``)."""
        head, _, rest = capability.partition(".")
        node: Any = self.caps.get(head)
        if not rest:
            return bool(node)
        if isinstance(node, list):
            return rest in node
        if isinstance(node, dict):
            return bool(node.get(rest)) or (rest in node and node[rest] == {})
        return False

    # Every size below comes from the capabilities (DISC-1): a server with a 32-token
    # vocabulary and one with 262,144 tokens are probed alike; nothing assumes the mock's bytes.
    @property
    def max_context(self) -> int:
        return int(self.base_model["max_context"])

    def limit(self, key: str, default: int = 1 << 30) -> int:
        """``limits[key]`` as an integer (``default`` when the server does not say)."""
        value = self.limits.get(key)
        return int(value) if isinstance(value, (int, float)) else default

    def token(self, i: int) -> int:
        """A valid token id for any vocabulary: ``i`` modulo ``vocab_size``."""
        return i % self.vocab

    def tokens(self, text: str) -> list[int]:
        """Token ids for a short ASCII text (character code modulo ``vocab_size``), at most
        ``max_context`` of them, so a datum or prompt built from them is always in range."""
        return [ord(ch) % self.vocab for ch in text][: max(2, self.max_context)]

    def top_k(self, fraction: float) -> int:
        """A ``top_k`` that keeps about ``fraction`` of the vocabulary and truncates something:
        in [1, vocab_size - 1] (``top_k`` above vocab_size is 422, section 4a)."""
        return max(1, min(self.vocab - 1, round(self.vocab * fraction)))

    def quota(self, key: str) -> int:
        """``limits[key]`` when the suite may fill that quota to see 409 ``quota_exceeded``
        (at most the quota probe), else a warning that names the option that would."""
        limit = int(self.limits[key])
        if limit > self.options.quota_probe:
            raise CheckWarning(
                f"quota clause not exercised: limits.{key} is {limit}, above the quota probe "
                f"({self.options.quota_probe}); run with --quota-probe {limit} (pytest: "
                f"--whitney-quota-probe {limit}) to fill it")
        return limit

    def num_samples(self, n: int) -> int:
        return max(1, min(n, self.limit("max_num_samples")))

    def sampling(self, prompt: Sequence[int], **params: Any) -> dict[str, Any]:
        """``payloads.sampling`` for ``prompt`` within this server's limits: ``max_tokens`` at
        most ``max_sample_tokens`` and what ``max_context`` leaves after the prompt (4a),
        ``top_k`` at most ``vocab_size``."""
        body = sampling(**params)
        room = self.max_context - len(prompt)
        body["max_tokens"] = max(1, min(body["max_tokens"], self.limit("max_sample_tokens"),
                                        room))
        body["top_k"] = min(body["top_k"], self.vocab)
        return body

    def sample_body(self, version: int, prompt: list[int], n: int = 1,
                    **params: Any) -> dict[str, Any]:
        """A ``sample`` body (without ``seq``) within this server's limits."""
        return {"version": version, "prompt": {"token_ids": prompt},
                "num_samples": self.num_samples(n), "sampling": self.sampling(prompt, **params)}

    def fits(self, data: Sequence[dict[str, Any]]) -> None:
        """A check's own valid ``forward`` request must be within the per-request limits; when
        this server's are smaller, the check says so instead of reporting a false failure."""
        tokens = sum(len(d["model_input"]["token_ids"]) for d in data)
        for key, value in (("max_datums_per_request", len(data)),
                           ("max_tokens_per_request", tokens)):
            if value > self.limit(key):
                raise CheckWarning(f"not exercised: this check sends {value} (limits.{key} is "
                                   f"{self.limit(key)})")

    def hold_pause(self) -> float:
        """How long to wait after sending a request that should be held before acting on the
        assumption that the server has it: several round trips, well inside order_wait_ms."""
        if self._rtt is None:
            samples = sorted(self.wire.call("GET", "/capabilities").elapsed for _ in range(3))
            self._rtt = samples[1]
        wait = int(self.limits.get("order_wait_ms", 1000)) / 1000
        return min(wait / 3, max(0.1, 4 * self._rtt))

    def wait(self, seconds: float, why: str) -> None:
        """A deliberate wait of the suite's own choosing: within ``--max-wait`` and what is
        left of ``--max-duration`` (else the clause is reported not exercised), with a
        progress line when it is long enough to notice."""
        if seconds > self.options.max_wait_seconds:
            raise CheckWarning(f"not exercised: waiting {seconds:.1f} s {why} is above the "
                               f"wait budget (--max-wait {self.options.max_wait_seconds:g})")
        if self.deadline is not None and time.monotonic() + seconds > self.deadline:
            raise CheckWarning(f"not exercised: waiting {seconds:.1f} s {why} would pass "
                               f"--max-duration")
        if seconds >= 1.0 and self.progress is not None:
            self.progress(f"{self.check_id}: waiting {seconds:.1f} s {why}")
        time.sleep(max(0.0, seconds))

    def hold(self, send: Callable[[], Reply]) -> Held:
        """Send ``send()`` on a helper thread and wait :meth:`hold_pause` (see :class:`Held`)."""
        return Held(send, self.hold_pause())

    # ---------------------------------------------------------------- resources
    def tag(self) -> dict[str, str]:
        return {"whitney-conformance-run": self.run_tag, "whitney-conformance-check": self.check_id}

    def create_session(self, body: dict[str, Any] | None = None, *, auth: str = PRIMARY,
                       expect: int = 201) -> Reply:
        """POST /sessions with the suite's tag merged into ``metadata`` (hygiene)."""
        payload = dict(body or {})
        payload["metadata"] = {**self.tag(), **(payload.get("metadata") or {})}
        reply = self.wire.call("POST", "/sessions", payload, auth=auth)
        if expect == 201:
            reply = self.await_session_slot(
                lambda: self.wire.call("POST", "/sessions", payload, auth=auth), auth, reply)
        expect_status(reply, expect, what="create session")
        if reply.status == 201:
            self.adopt_session(reply, auth)
        return reply

    def await_session_slot(self, send: Callable[[], Reply], auth: str, reply: Reply) -> Reply:
        """``reply`` to a session creation this check needs, or, when it is 409
        ``quota_exceeded``, ``send()`` again until a slot frees. The suite's checks run beside
        each other (and LIFE-1 fills the quota on purpose), so another check may hold the
        key's ``max_sessions``: retry within the wait budget. A check that alone needs more
        than the limit, or that still finds every slot held by the suite's own sessions at
        the end, is reported not exercised; otherwise the last answer is judged as it is."""
        if not (reply.status == 409 and reply.error_type == "quota_exceeded"):
            return reply
        limit = self.limit("max_sessions")
        tracker = self.wire.tracker
        own = sum(1 for h in self._sessions if h.auth == auth
                  and not (h.id in tracker.sessions and tracker.sessions[h.id].closed))
        if own >= limit:
            raise CheckWarning(f"not exercised: the check holds {own} open session(s) and needs "
                               f"one more (limits.max_sessions is {limit})")
        budget = 2 * self.options.max_wait_seconds
        if self.deadline is not None:
            budget = min(budget, self.deadline - time.monotonic())
        give_up = time.monotonic() + max(0.0, budget)
        while time.monotonic() < give_up:
            time.sleep(0.05)
            reply = send()
            if not (reply.status == 409 and reply.error_type == "quota_exceeded"):
                return reply
        if self._open_sessions(auth) >= limit:
            raise CheckWarning(f"not exercised: limits.max_sessions is {limit} and the "
                               f"suite's other checks kept them all open for "
                               f"{max(0.0, budget):.1f} s")
        return reply

    def _open_sessions(self, auth: str) -> int:
        """Sessions of key ``auth`` the suite created and has not seen closed or expired."""
        tracker = self.wire.tracker
        with tracker.lock:
            return sum(1 for s in tracker.sessions.values() if s.key == auth and not s.closed)

    def adopt_session(self, reply: Reply, auth: str = PRIMARY) -> SessionHandle:
        """Make a session created by a raw request this check's (closed when it ends)."""
        handle = SessionHandle(self, reply.body, auth)
        self._sessions.append(handle)
        return handle

    def session(self, *, auth: str = PRIMARY, fresh: bool = False,
                **body: Any) -> SessionHandle:
        """An open session of this check with room for one more run."""
        limit = int(self.limits.get("max_runs_per_session") or 1_000_000)
        if not fresh and not body:
            for handle in reversed(self._sessions):
                tracked = self.wire.tracker.sessions.get(handle.id)
                if (handle.auth == auth and len(handle.runs) < limit
                        and not (tracked and tracked.closed)):
                    return handle
        self.create_session(body, auth=auth)
        return self._sessions[-1]

    @property
    def lora_rank(self) -> int:
        """The LoRA rank of the suite's runs: 4, or ``max_lora_rank`` when that is smaller."""
        return max(1, min(4, int(self.base_model["max_lora_rank"])))

    def run_body(self, *, seed: int = 1234, rank: int | None = None, alpha: float = 8.0,
                 **extra: Any) -> dict[str, Any]:
        lora: dict[str, Any] = {"rank": self.lora_rank if rank is None else rank,
                                "alpha": alpha}
        if seed is not None:
            lora["seed"] = seed
        return {"base_model": self.base_model["id"], "lora": lora, "optimizer": "adamw", **extra}

    def run(self, *, seed: int = 1234, rank: int | None = None, alpha: float = 8.0,
            session: SessionHandle | None = None, auth: str = PRIMARY) -> RunHandle:
        """A new active run (LIFE-5 body) in ``session`` or this check's session."""
        session = session or self.session(auth=auth)
        reply = self.wire.call("POST", f"/sessions/{session.id}/runs",
                               self.run_body(seed=seed, rank=rank, alpha=alpha), auth=auth)
        expect_status(reply, 201, what="create run")
        handle = RunHandle(self, reply.body, auth=auth)
        session.runs.append(handle)
        return handle

    def end_check_resources(self) -> None:
        """Finish (or wait out) every run of the check, then close its sessions."""
        sessions, self._sessions = self._sessions, []
        for session in sessions:
            for run in session.runs:
                self._end_run(run.id, run.auth)
            self.wire.call("POST", f"/sessions/{session.id}/close", {}, auth=session.auth)

    def _end_run(self, run_id: str, auth: str) -> None:
        state = self.wire.state_of(f"/runs/{run_id}", auth)
        if state is None or state in TERMINAL:
            return
        if state == "active":
            reply = self.wire.call("POST", f"/runs/{run_id}/finish", {}, auth=auth)
            if reply.status == 200 and (reply.body or {}).get("state") in TERMINAL:
                return
            self.wire.call("POST", f"/runs/{run_id}/cancel", {}, auth=auth)
        self.wire.wait_terminal(run_id, auth)
