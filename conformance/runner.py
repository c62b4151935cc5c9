"""Run checks against a target, end every resource, and summarise.

Hygiene: each check's sessions are closed when it returns or raises; teardown then sweeps
everything the tracker saw created (by checks or the fuzzer, under either key): runs that are
not terminal are cancelled and polled until terminal, then sessions are closed, and each one
is read back so the summary can state that all were closed. Teardown also runs on Ctrl-C.
"""

from __future__ import annotations

import threading
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from .checks import all_checks
from .checks.discovery import capabilities_problem
from .context import Ctx
from .options import Options
from .registry import Check, CheckFailed, CheckUnsupported, CheckWarning, Level, Status, select
from .schema import OpenAPI
from .target import API_PREFIX, Target
from .wire import PRIMARY, SECOND, TERMINAL, Wire

__all__ = ["CheckOutcome", "PreflightFailed", "Resources", "Summary", "Suite", "run_suite"]


class PreflightFailed(Exception):
    """The endpoint cannot be tested at all (unreachable, key refused, no capabilities); the
    message is one line saying what to fix. No check ran and nothing was created."""


@dataclass
class CheckOutcome:
    check: Check
    status: Status
    detail: str = ""
    seconds: float = 0.0
    strict: list[str] = field(default_factory=list)  # strict-only findings (--profile strict)

    @property
    def counts_as_failure(self) -> bool:
        """A failure of a MUST, or of a declared optional capability (exit code 1)."""
        return self.status in (Status.FAIL, Status.ERROR) and self.check.level is not Level.SHOULD


@dataclass
class Resources:
    sessions_created: int = 0
    sessions_closed: int = 0
    runs_created: int = 0
    runs_terminal: int = 0
    leaked: list[str] = field(default_factory=list)
    session_ids: list[str] = field(default_factory=list)  # every session the run created

    @property
    def all_closed(self) -> bool:
        return not self.leaked and self.sessions_closed == self.sessions_created \
            and self.runs_terminal == self.runs_created


@dataclass
class Summary:
    target: str
    profile: str
    run_tag: str
    outcomes: list[CheckOutcome]
    resources: Resources
    requests: int
    tokens_sent: int
    sample_tokens_requested: int
    seconds: float
    interrupted: bool = False
    capabilities: dict[str, Any] = field(default_factory=dict)
    #: Every response problem only the strict overlay found, as (check id, problem): SCHEMA-1
    #: reports their number and the first few; this is the whole list.
    strict_problems: list[tuple[str, str]] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        """0 pass; 1 a contract rule fails; 3 (``--profile strict``) the contract passes but
        strict-only findings remain; 130 interrupted."""
        if self.interrupted:
            return 130
        if any(o.counts_as_failure for o in self.outcomes):
            return 1
        return 3 if self.strict_only_rules() else 0

    def failing_rules(self) -> set[str]:
        """Rules the endpoint breaks (contract failures only)."""
        return {o.check.rule for o in self.outcomes if o.counts_as_failure}

    def strict_only_rules(self) -> set[str]:
        """Rules whose checks pass the contract but differ from the mock's exact shapes."""
        return {o.check.rule for o in self.outcomes if o.status is Status.STRICT}

    def counts(self) -> dict[str, int]:
        out = {status.value: 0 for status in Status}
        for outcome in self.outcomes:
            out[outcome.status.value] += 1
        return out


class Suite:
    """One conformance run against one target."""

    def __init__(self, target: Target, *, openapi: OpenAPI | None = None,
                 validate_schema: bool = True, options: Options | None = None,
                 run_tag: str | None = None) -> None:
        self.target = target
        self.run_tag = run_tag or uuid.uuid4().hex[:12]
        self.options = options = options or Options()
        self.profile = options.profile
        strict_openapi = None
        if validate_schema:
            openapi = openapi or OpenAPI.load()
            if self.profile == "strict":
                strict_openapi = openapi.as_profile("strict")
        self.wire = Wire(target, openapi if validate_schema else None, strict_openapi)
        self.deadline = (time.monotonic() + options.max_duration_seconds
                         if options.max_duration_seconds else None)
        self.progress: Callable[[str], None] | None = None
        self.ctx = self._context()

    def _context(self, caps: dict[str, Any] | None = None) -> Ctx:
        return Ctx(wire=self.wire, run_tag=self.run_tag, options=self.options,
                   caps=caps or {}, deadline=self.deadline, progress=self._progress)

    def _progress(self, line: str) -> None:
        if self.progress is not None:
            self.progress(self.wire.mask(line))

    def preflight(self) -> None:
        """Before any check: the endpoint answers, accepts the key(s), and its capabilities
        parse (DISC-1's essentials). Raises :class:`PreflightFailed` with what to fix."""
        self.wire.current_check = "(preflight)"
        where = f"{self.target.base_url}{API_PREFIX}/capabilities"
        try:
            reply = self.wire.call("GET", "/capabilities")
        except httpx.HTTPError as exc:
            raise PreflightFailed(f"cannot reach {where} ({type(exc).__name__}: {exc}); check "
                                  f"--base-url (the endpoint root, or the root plus "
                                  f"{API_PREFIX})") from None
        if reply.status == 401:
            raise PreflightFailed(f"{where} refused the API key (401); check --api-key or "
                                  f"WHITNEY_API_KEY")
        if reply.status == 404:
            raise PreflightFailed(f"{where} is 404; is --base-url the root of a Whitney "
                                  f"endpoint (or the root plus {API_PREFIX})?")
        if reply.status != 200:
            raise PreflightFailed(f"GET {where} answered {reply.describe()}; the suite needs "
                                  f"200 with the capabilities (DISC-1)")
        problem = capabilities_problem(reply.body)
        if problem:
            raise PreflightFailed(f"GET {where} does not parse as Whitney capabilities: "
                                  f"{problem}")
        if self.target.second_api_key:
            second = self.wire.call("GET", "/capabilities", auth=SECOND)
            if second.status != 200:
                raise PreflightFailed(f"{where} refused the second API key ({second.status}); "
                                      f"check --second-api-key or WHITNEY_SECOND_API_KEY")
        self.ctx.caps = reply.body

    def side_context(self) -> Ctx:
        """A context for a check running beside the main sequence (its own resources)."""
        return self._context(self.ctx.caps)

    def run_check(self, entry: Check, ctx: Ctx | None = None) -> CheckOutcome:
        """Run one check; ``ctx`` other than the suite's means a side thread."""
        if self.deadline is not None and time.monotonic() >= self.deadline:
            return CheckOutcome(entry, Status.NOT_RUN, "not started: the run reached "
                                                       "--max-duration")
        if entry.capability and not self.ctx.declares(entry.capability):
            return CheckOutcome(entry, Status.UNSUPPORTED, f"{entry.capability} not declared in "
                                                      f"GET /capabilities")
        if entry.needs_second_key and not self.target.second_api_key:
            return CheckOutcome(entry, Status.UNSUPPORTED, "no second API key (--second-api-key / "
                                                      "WHITNEY_SECOND_API_KEY)")
        ctx = ctx or self.ctx
        if ctx is self.ctx:
            self.wire.current_check = entry.id
        else:
            self.wire.bind_thread(entry.id)
        ctx.check_id = entry.id
        ctx.strict_findings = []
        started = time.monotonic()
        status, detail = Status.PASS, ""
        try:
            entry.func(ctx)
        except CheckFailed as exc:
            status = Status.WARN if entry.level is Level.SHOULD else Status.FAIL
            detail = str(exc)
        except CheckWarning as exc:
            status, detail = Status.WARN, str(exc)
        except CheckUnsupported as exc:
            status, detail = Status.UNSUPPORTED, str(exc)
        except (KeyError, TypeError, IndexError, ValueError, AttributeError) as exc:
            # A response without the fields the contract promises ends a check here.
            status = Status.WARN if entry.level is Level.SHOULD else Status.FAIL
            detail = f"unexpected response shape: {type(exc).__name__}: {exc} " \
                     f"({_where(exc)})"
        except httpx.HTTPError as exc:
            status, detail = Status.ERROR, f"transport error: {type(exc).__name__}: {exc}"
        finally:
            try:
                ctx.end_check_resources()
            except httpx.HTTPError:
                pass  # teardown sweeps whatever is left
        strict = [self.wire.mask(f) for f in ctx.strict_findings] if self.profile == "strict" \
            else []
        if strict and status is Status.PASS:
            status, detail = Status.STRICT, "strict-only: " + "; ".join(strict)
        elif strict:
            detail += " | strict-only: " + "; ".join(strict)
        return CheckOutcome(entry, status, self.wire.mask(detail), time.monotonic() - started,
                            strict)

    def teardown(self) -> Resources:
        """Cancel every non-terminal run, close every session, and verify."""
        self.wire.current_check = "(teardown)"
        tracker = self.wire.tracker
        resources = Resources(sessions_created=len(tracker.sessions),
                              runs_created=len(tracker.runs),
                              session_ids=list(tracker.sessions))

        def auth_of(label: str) -> str:
            return SECOND if label == SECOND else PRIMARY

        for run in list(tracker.runs.values()):
            if run.terminal:
                continue
            try:
                reply = self.wire.call("GET", f"/runs/{run.run_id}", auth=auth_of(run.key))
                if reply.status == 200 and reply.body.get("state") not in TERMINAL:
                    if reply.body.get("state") == "active":
                        self.wire.call("POST", f"/runs/{run.run_id}/cancel", {},
                                       auth=auth_of(run.key))
                    self.wire.wait_terminal(run.run_id, auth_of(run.key), timeout=15.0)
            except httpx.HTTPError:
                pass
        for session in list(tracker.sessions.values()):
            if session.closed:
                continue
            try:
                self.wire.call("POST", f"/sessions/{session.session_id}/close", {},
                               auth=auth_of(session.key))
            except httpx.HTTPError:
                pass
        for run in tracker.runs.values():
            state = self._state(f"/runs/{run.run_id}", auth_of(run.key))
            if state in TERMINAL:
                resources.runs_terminal += 1
            else:
                resources.leaked.append(f"run {run.run_id} ({state}, from {run.check_id})")
        for session in tracker.sessions.values():
            state = self._state(f"/sessions/{session.session_id}", auth_of(session.key))
            if state in ("closed", "expired"):
                resources.sessions_closed += 1
            else:
                resources.leaked.append(f"session {session.session_id} ({state}, from "
                                        f"{session.check_id})")
        return resources

    def _state(self, path: str, auth: str) -> str | None:
        try:
            reply = self.wire.call("GET", path, auth=auth)
        except httpx.HTTPError as exc:
            return f"unreadable: {type(exc).__name__}"
        if reply.status != 200 or not isinstance(reply.body, dict):
            return f"GET -> {reply.status}"
        return reply.body.get("state")


def _where(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    for frame in reversed(frames):
        if "/conformance/" in frame.filename:
            return f"{frame.filename.rsplit('/', 1)[-1]}:{frame.lineno}"
    return "?"


def _join_side(side: threading.Thread, slow: list[Check], outcomes: dict[str, CheckOutcome],
               on_outcome: Callable[[CheckOutcome], None] | None) -> None:
    side.join()
    for entry in slow:
        if on_outcome and entry.id in outcomes:
            on_outcome(outcomes[entry.id])


def run_suite(target: Target, *, only: list[str] | None = None, keep_going: bool = True,
              options: Options | None = None, openapi: OpenAPI | None = None,
              validate_schema: bool = True,
              on_outcome: Callable[[CheckOutcome], None] | None = None,
              on_progress: Callable[[str], None] | None = None,
              run_tag: str | None = None) -> Summary:
    """Run the selected checks (all by default) and tear down; never raises on Ctrl-C.

    First a preflight (:meth:`Suite.preflight`): an endpoint that cannot be tested raises
    :class:`PreflightFailed` before any check runs. ``on_outcome`` sees each result as it
    comes, ``on_progress`` one line per long wait ("LIFE-4:expiry: waiting 2.0 s ...").
    ``options.max_duration_seconds`` bounds the run: checks not started by then are
    ``not_run`` and waits inside a check stop there.

    ``only`` selects by rule-id prefix (see ``registry.select``); the aggregate checks over
    every response are added to any selection. Without ``keep_going`` the run stops at the
    first failing MUST check; the rest are reported ``not_run``. Checks marked ``run_last``
    (aggregates over every response) run after the others. Responses are validated against
    ``openapi`` (default: the packaged ``openapi.yaml``) unless ``validate_schema`` is false;
    under ``options.profile == "strict"`` also against it with ``strict.yaml`` applied, and
    what only that finds is reported as strict-only (status ``strict``), never a failure.
    """
    started = time.monotonic()
    suite = Suite(target, openapi=openapi, validate_schema=validate_schema, options=options,
                  run_tag=run_tag)
    suite.progress = on_progress
    try:
        suite.preflight()
    except BaseException:
        suite.wire.close()
        raise
    checks = select(all_checks(), only)
    if only and checks:
        # Aggregates over every response (SCHEMA-1, TRANSPORT-1:every-response) always judge
        # the responses of whatever ran: a restricted run must not hide a schema violation.
        checks += [c for c in all_checks() if c.run_last and c not in checks]
    ordered = [c for c in checks if not c.run_last] + [c for c in checks if c.run_last]
    outcomes: dict[str, CheckOutcome] = {}
    interrupted = False
    side: threading.Thread | None = None
    try:
        # Checks that mostly wait (TTL expiry, order_wait_ms) run in one side thread while
        # the others proceed; aggregates (run_last) wait for it.
        slow = [c for c in ordered if c.slow and not c.run_last]

        def run_slow() -> None:
            side_ctx = suite.side_context()
            for entry in slow:
                outcomes[entry.id] = suite.run_check(entry, side_ctx)

        if slow:
            side = threading.Thread(target=run_slow, name="conformance-slow", daemon=True)
            side.start()
        stop = False
        for entry in ordered:
            if entry.slow and not entry.run_last:
                continue
            if entry.run_last and side is not None:
                _join_side(side, slow, outcomes, on_outcome)
                side = None
            if stop and not entry.run_last:
                outcomes[entry.id] = CheckOutcome(entry, Status.NOT_RUN, "stopped after a failure "
                                                                    "(use --keep-going)")
                continue
            outcome = suite.run_check(entry)
            outcomes[entry.id] = outcome
            if on_outcome:
                on_outcome(outcome)
            if outcome.counts_as_failure and not keep_going:
                stop = True
        if side is not None:
            _join_side(side, slow, outcomes, on_outcome)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        try:
            resources = suite.teardown()
        except KeyboardInterrupt:
            interrupted = True
            resources = Resources(sessions_created=len(suite.wire.tracker.sessions),
                                  runs_created=len(suite.wire.tracker.runs),
                                  leaked=["teardown interrupted"])
        suite.wire.close()
    for entry in ordered:
        outcomes.setdefault(entry.id, CheckOutcome(entry, Status.NOT_RUN, "interrupted"))
    return Summary(
        target=target.description, profile=suite.profile, run_tag=suite.run_tag,
        outcomes=[outcomes[c.id] for c in checks], resources=resources,
        requests=suite.wire.requests, tokens_sent=suite.wire.tokens_sent,
        sample_tokens_requested=suite.wire.sample_tokens_requested,
        seconds=time.monotonic() - started, interrupted=interrupted,
        capabilities=suite.ctx.caps, strict_problems=list(suite.wire.strict_problems))
