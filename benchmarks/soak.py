"""``python -m benchmarks.soak``: a bounded soak of the mock over uvicorn, under injected faults.

``--clients`` clients (one API key each) run pipelined GRPO cycles against one mock served by
uvicorn on 127.0.0.1 (never another interface), in this process:

    save_weights_for_sampler(version k) ‖ sample(version k) per prompt     (sent at once, ORD-2)
    -> rewards, group advantages (mean-centred, std-normalised)
    -> forward_backward(importance_sampling) ‖ optim_step(explicit AdamW)  (sent at once)

then save_state ‖ export_lora, finish, close. A chaos thread arms faults through the control
plane (``POST /_mock/faults``, with the mock's control key) on the cycle primitives, in turn:
503 before executing, 503 after executing, a dropped response after executing, latency longer
than the clients' read timeout (a client-side timeout), and 429 with ``Retry-After``. Before the
clients start it also arms dropped responses on ``--dropped-creations`` session creations and
as many run creations (the server created the resource, the client never heard). Clients
retry every primitive with the SAME seq and the SAME bytes (ORD-3) and every creation with the
SAME ``Idempotency-Key`` (LIFE-9), so every lost answer comes back as a replay.

Checked at the end (any failure: exit status 1):

- every run's trace (``GET /_mock/trace``) is exactly the seqs and primitives its client
  intended, each once and completed;
- every answer a client kept equals what a fault-free replay of the same bodies on a fresh
  in-process mock answers (so nothing ran twice or out of order), and the final run view
  matches (state, step, versions);
- no 5xx reached a client except the injected ones, and the server logged no crash;
- nothing lost and nothing created twice: each client's key lists (LIFE-10) exactly the one
  session the client knows, holding exactly the one run it knows, closed and finished
  (``lost`` counts what a client created but does not know or could not create, and what was
  left open; ``double_created`` what exists beyond one session and one run per client);
- traced memory (tracemalloc, this whole process) is back to its baseline. Baseline and end
  are reached the same way: a fault-free client warms every cache (the model's bounded cache
  of compiled adapters included), then empty sessions push everything out of the mock's
  closed-session window. Also reported: the peak during the soak, and ``after_close``, what
  the mock still keeps for the closed sessions (their ORD-3 records) before they leave.

It stops by itself: each client runs ``--cycles`` cycles or stops starting new ones after
``--seconds``.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import socket
import sys
import threading
import time
import tracemalloc
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from typing import Any

import httpx
import orjson

from mock_server import InProcessTransport, create_app

from .soak_client import (
    API,
    CREATIONS,
    FAULTS,
    Chaos,
    ClientResult,
    Config,
    Counters,
    SoakError,
    grpo_client,
    run_body,
)

__all__ = ["FAULTS", "Config", "main", "run_soak"]


class Server:
    """uvicorn on a socket bound to 127.0.0.1 (port chosen by the kernel), on a thread."""

    def __init__(self, app: Any) -> None:
        import uvicorn

        # proto=IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY on accepted connections only when
        # the listening socket says TCP; without it every response (headers and body are two
        # writes) waits ~40 ms for the client's delayed ACK.
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off",
                                                    access_log=False))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       name="soak-uvicorn", daemon=True)

    def __enter__(self) -> Server:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
        self.sock.close()


class ServerLog(logging.Filter):
    """Sorts what the mock and uvicorn log: injected drops and clients that hung up before
    their body was read are expected here (counted, kept off stderr); any other exception or
    error is a crash and fails the soak."""

    def __init__(self) -> None:
        super().__init__()
        self.crashes: list[str] = []
        self.expected: Counter[str] = Counter()

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        name = type(exc).__name__ if exc else ""
        if not exc and str(record.msg).startswith("injected fault"):
            name = "InjectedDrop"  # already rewritten by mock_server.http.control's own filter
        if name in ("InjectedDrop", "ClientDisconnect"):
            self.expected[name] += 1
            return False
        if exc is not None or record.levelno >= logging.ERROR:
            self.crashes.append(f"{record.getMessage()[:200]} ({name}: {exc})")
        return True


def reference_answers(results: list[ClientResult], seed: int) -> dict[int, dict[int, bytes]]:
    """Replay each client's intended bodies, in seq order, on a fresh fault-free mock."""
    app = create_app(api_keys=("reference",), seed=seed)
    transport = InProcessTransport(app)
    http = httpx.Client(transport=transport, base_url="http://reference" + API,
                        headers={"Authorization": "Bearer reference"}, timeout=60)
    out: dict[int, dict[int, bytes]] = {}
    try:
        for result in results:
            session = http.post("/sessions", content=b"{}").json()["session_id"]
            run = http.post(f"/sessions/{session}/runs", content=run_body(result.index)).json()
            out[result.index] = {seq: http.post(f"/runs/{run['run_id']}/{primitive}",
                                                content=raw).content
                                 for seq, primitive, raw in sorted(result.intended)}
    finally:
        http.close()
        transport.close()
    return out


def comparable(raw: bytes) -> Any:
    """A result with the server-chosen ids removed (checkpoint and export ids differ)."""
    value = orjson.loads(raw)
    for key in ("checkpoint_id", "export_id"):
        value.pop(key, None)
    return value


def verify(results: list[ClientResult], trace: dict[str, list[dict[str, Any]]],
           reference: dict[int, dict[int, bytes]]) -> tuple[list[str], int]:
    """Problems found, and how many of them are mismatches (trace, answer or final view)."""
    problems: list[str] = []
    for r in results:
        who = f"client {r.index}"
        if r.error:
            problems.append(f"{who}: {r.error}")
            continue
        intended = sorted((seq, primitive) for seq, primitive, _ in r.intended)
        entries = trace.get(r.run_id, [])
        executed = [(e["seq"], e["primitive"]) for e in entries]
        if executed != intended or {e["status"] for e in entries} != {"completed"}:
            problems.append(f"{who}: trace {executed} != intended {intended}")
        for seq, raw in r.answers.items():
            if comparable(raw) != comparable(reference[r.index][seq]):
                problems.append(f"{who}: seq {seq} answer differs from the fault-free replay")
        view = r.final_view
        if (view.get("state"), view.get("step"), [v["version"] for v in view.get("versions", [])]) \
                != ("finished", r.optim_steps, r.versions):
            problems.append(f"{who}: final view {view}")
    failed = sum(1 for r in results if r.error)
    return problems, len(problems) - failed


def count_created(base_url: str, results: list[ClientResult], seed: int) -> dict[str, int]:
    """Server side against client side, per client key: the soak's sessions its key lists
    (LIFE-10, the client's metadata tag) and their runs, versus the one session and one run
    the client knows."""
    counts = dict.fromkeys(("sessions_server", "runs_server", "sessions_client", "runs_client",
                            "lost", "double_created"), 0)
    for r in results:
        with httpx.Client(base_url=base_url + API, timeout=30,
                          headers={"Authorization": f"Bearer soak-key-{r.index:02d}"}) as http:
            page = http.get("/sessions", params={"metadata_key": "soak-client",
                                                 "metadata_value": str(r.index),
                                                 "limit": 200}).json()
        sessions = [v for v in page["sessions"] if v["metadata"].get("soak-seed") == str(seed)]
        runs = [run for view in sessions for run in view["runs"]]
        counts["sessions_server"] += len(sessions)
        counts["runs_server"] += len(runs)
        counts["sessions_client"] += bool(r.session_id)
        counts["runs_client"] += bool(r.run_id)
        known_sessions = [v for v in sessions if v["session_id"] == r.session_id]
        known_runs = [run for run in runs if run["run_id"] == r.run_id]
        counts["double_created"] += len(sessions) - len(known_sessions)
        counts["double_created"] += len(runs) - len(known_runs)
        counts["lost"] += (not r.session_id) + (not r.run_id)  # creations that never came back
        counts["lost"] += sum(1 for v in known_sessions if v["state"] != "closed")
        counts["lost"] += sum(1 for run in known_runs if run["state"] != "finished")
        counts["lost"] += (bool(r.session_id) and not known_sessions) + \
            (bool(r.run_id) and not known_runs)  # known to the client, not to the server
    return counts


def cycle_empty_sessions(base_url: str, key: str, n: int) -> None:
    with httpx.Client(base_url=base_url + API, headers={"Authorization": f"Bearer {key}"},
                      timeout=30) as http:
        for _ in range(n):
            sid = http.post("/sessions", content=b"{}").json()["session_id"]
            http.post(f"/sessions/{sid}/close", content=b"{}").raise_for_status()


def settle(base_url: str, key: str, window: int) -> None:
    """A fault-free client (enough cycles to turn over every bounded cache), then ``window``
    + 1 empty sessions so that it, and anything before it, leaves the closed-session window."""
    warm = grpo_client(Config(clients=1, cycles=5), base_url, 0, Counters(),
                       time.monotonic() + 120)
    if warm.error:
        raise SoakError(f"settling client: {warm.error}")
    cycle_empty_sessions(base_url, key, window + 1)


def run_soak(config: Config) -> dict[str, Any]:
    """Run the soak; returns its figures and ``problems`` (empty when everything held)."""
    keys = [f"soak-key-{i:02d}" for i in range(config.clients)]
    app = create_app(api_keys=keys, seed=config.seed, control_plane=True,
                     limits={"order_wait_ms": 5000}, violations=frozenset(config.violations))
    control_key: str = app.state.control_key  # faults on every call, every run's trace
    # The mock forgets a closed session after `closed_retention` more have closed; the soak
    # measures memory once its sessions are gone, so a window just above the number of
    # clients keeps that flush short. Its size changes when memory returns, not whether.
    window = app.state.backend.closed_retention = config.clients + 16
    server_log = ServerLog()
    loggers = [logging.getLogger(n) for n in ("mock_server", "uvicorn.error")]
    for logger in loggers:
        logger.addFilter(server_log)
    figures: dict[str, Any] = {"config": asdict(config)}
    problems: list[str] = []
    mib = 1024 * 1024
    started = time.monotonic()
    try:
        with Server(app) as server:
            # Bring the process to a steady state, traced, so that the end can return to the
            # same one: a fault-free client warms every cache on the path (base model,
            # safetensors, pydantic, connections, the model's bounded cache of compiled
            # adapters), then empty sessions push it out of the closed-session window. The
            # end repeats exactly this, so baseline and residual count the same things.
            settle(server.url, keys[0], window)
            phases = {"warm_up": time.monotonic() - started}
            tracemalloc.start()
            settle(server.url, keys[0], window)
            gc.collect()
            baseline = tracemalloc.get_traced_memory()[0]
            tracemalloc.reset_peak()
            phases["baseline"] = time.monotonic() - started - sum(phases.values())

            counters = Counters()
            chaos = Chaos(server.url, control_key, config)
            chaos.arm_creation_drops()
            chaos.start()
            deadline = time.monotonic() + config.seconds
            with ThreadPoolExecutor(max_workers=config.clients) as pool:
                results = list(pool.map(
                    lambda i: grpo_client(config, server.url, i, counters, deadline),
                    range(config.clients)))
            phases["clients"] = time.monotonic() - started - sum(phases.values())
            chaos.stop.set()
            chaos.join(timeout=30)
            fired = chaos.fired()
            chaos.http.delete("/_mock/faults")
            chaos.http.close()
            if "timeout" in config.fault_kinds:  # delayed originals land (as replays)
                time.sleep(config.client_timeout * 2)
            with httpx.Client(base_url=server.url, timeout=30,
                              headers={"Authorization": f"Bearer {control_key}"}) as http:
                trace = http.get("/_mock/trace").json()["runs"]
            created = count_created(server.url, results, config.seed)
            peak = tracemalloc.get_traced_memory()[1] - baseline

            phases["settle"] = time.monotonic() - started - sum(phases.values())
            reference = reference_answers(results, config.seed)
            problems, mismatches = verify(results, trace, reference)
            figures.update({
                "clients": config.clients,
                "cycles_completed": sum(len(r.versions) for r in results),
                "primitives": sum(len(r.intended) for r in results), "faults_fired": fired,
                "faults_total": sum(fired.values()),
                "injected_429": fired["429_retry_after"],
                "dropped_creations": sum(fired[f"drop_{name}"] for name in CREATIONS),
                **counters.as_dict(), **created,
                "mismatches": mismatches, "failed_clients": sum(1 for r in results if r.error),
            })
            phases["verify"] = time.monotonic() - started - sum(phases.values())
            # Drop what this process kept for checking (bodies, answers, the replay): what is
            # left is what the mock keeps for the closed sessions (ORD-3 records, until they
            # leave the closed-session window). Push them out, and measure again.
            del results, reference, trace
            gc.collect()
            after_close = tracemalloc.get_traced_memory()[0] - baseline
            settle(server.url, keys[0], window)
            gc.collect()
            residual = tracemalloc.get_traced_memory()[0] - baseline
            tracemalloc.stop()
            phases["flush"] = time.monotonic() - started - sum(phases.values())
    finally:
        for logger in loggers:
            logger.removeFilter(server_log)
        if tracemalloc.is_tracing():
            tracemalloc.stop()
    if chaos.error:
        problems.append(f"chaos thread: {chaos.error}")
    if counters.unexpected_5xx:
        problems.append(f"{counters.unexpected_5xx} 5xx answers that were not injected")
    if figures.get("lost") or figures.get("double_created"):
        problems.append(f"lost {figures.get('lost')}, double-created "
                        f"{figures.get('double_created')} (server: {figures.get('sessions_server')}"
                        f" sessions / {figures.get('runs_server')} runs, clients: "
                        f"{figures.get('sessions_client')} / {figures.get('runs_client')})")
    problems += [f"server logged: {c}" for c in server_log.crashes]
    # What stays is bounded caches (urllib/re/httpx URL caches, numpy, thread bookkeeping,
    # ~0.2 MiB whatever the soak's length); the soak's sessions alone weigh several MiB.
    if residual > max(mib // 2, peak // 100):
        problems.append(f"memory not back to baseline: {residual / mib:.2f} MiB still traced")
    figures.update({
        "peak_traced_mib": round(peak / mib, 2), "after_close_mib": round(after_close / mib, 2),
        "residual_mib": round(residual / mib, 3), "seconds": round(time.monotonic() - started, 1),
        "phase_seconds": {k: round(v, 1) for k, v in phases.items()},
        "expected_server_logs": dict(server_log.expected), "problems": problems,
    })
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    defaults = Config()
    parser.add_argument("--clients", type=int, default=defaults.clients)
    parser.add_argument("--cycles", type=int, default=defaults.cycles, help="per client")
    parser.add_argument("--seconds", type=float, default=defaults.seconds,
                        help="no new cycle starts after this")
    parser.add_argument("--client-timeout", type=float, default=defaults.client_timeout,
                        help="read timeout; injected latency is 1.5x this")
    parser.add_argument("--fault-interval", type=float, default=defaults.fault_interval,
                        help="seconds between two armed faults (one pending per primitive)")
    parser.add_argument("--fault-burst", type=int, default=defaults.fault_burst,
                        help="how many consecutive matching calls one armed fault hits")
    parser.add_argument("--faults", default=",".join(defaults.fault_kinds),
                        help=f"fault kinds to inject, from {','.join(FAULTS)}")
    parser.add_argument("--fault-primitives", default=",".join(defaults.fault_primitives),
                        help="primitives the faults target")
    parser.add_argument("--dropped-creations", type=int, default=defaults.dropped_creations,
                        help="responses dropped after creating, per creation kind (sessions, "
                             "runs); the clients' Idempotency-Key must bring each back")
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    config = Config(clients=args.clients, cycles=args.cycles, seconds=args.seconds,
                    client_timeout=args.client_timeout, fault_interval=args.fault_interval,
                    fault_burst=args.fault_burst, seed=args.seed,
                    dropped_creations=args.dropped_creations,
                    fault_kinds=tuple(k for k in args.faults.split(",") if k),
                    fault_primitives=tuple(p for p in args.fault_primitives.split(",") if p))
    unknown = set(config.fault_kinds) - set(FAULTS)
    if unknown or not config.fault_kinds:
        parser.error(f"--faults: unknown kind(s) {sorted(unknown)}; known: {list(FAULTS)}")
    figures = run_soak(config)
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        for key, value in figures.items():
            if key not in ("config", "problems"):
                print(f"{key:>18}: {value}")
        for problem in figures["problems"]:
            print(f"PROBLEM: {problem}", file=sys.stderr)
        print("OK" if not figures["problems"] else "FAILED")
    return 0 if not figures["problems"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
