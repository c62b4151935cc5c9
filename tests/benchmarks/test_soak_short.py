"""A short run of the soak (``benchmarks/soak.py``): 16 clients, two pipelined GRPO cycles
each, over uvicorn on 127.0.0.1, while the chaos thread injects 503s (before and after
executing), dropped responses, latency past the clients' read timeout and 429 with
``Retry-After``, and the responses of some session and run creations are dropped after the
server created them (LIFE-9: the clients' Idempotency-Key brings each back).

What it proves (ORD-2, ORD-3, ORD-4, LIFE-3): every run executed exactly what its client
intended, once, in order (the server's trace and a fault-free replay of the same bodies
agree with every answer the client kept), no 5xx reached a client except injected ones, and
memory went back to its baseline after the sessions closed; each client's key lists exactly
the one session and one run the client knows (0 lost, 0 double-created). The soak's own checks
are listed
in ``figures["problems"]``; the assertions below also make sure faults did fire, so the run
was not vacuous.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # ``benchmarks`` is not an installed package
    sys.path.insert(0, str(ROOT))

from benchmarks.soak import FAULTS, Config, run_soak  # noqa: E402
from benchmarks.soak_client import CREATIONS  # noqa: E402


def test_soak_short_every_intended_primitive_exactly_once_under_faults():
    figures = run_soak(Config(clients=16, cycles=2, seconds=15, seed=0, fault_interval=0.02,
                              fault_burst=3))
    assert figures["problems"] == [], figures["problems"]
    assert figures["failed_clients"] == 0 and figures["mismatches"] == 0
    assert figures["unexpected_5xx"] == 0
    # 16 clients x (2 x (save + 2 samples [+ forward_backward + optim_step]) + save_state
    # + export): a cycle whose groups all score alike skips the update
    assert figures["cycles_completed"] == 32
    assert 16 * 8 <= figures["primitives"] <= 16 * 12
    fired = figures["faults_fired"]
    assert set(fired) == set(FAULTS) | {f"drop_{name}" for name in CREATIONS}
    assert figures["faults_total"] >= 4, fired
    # LIFE-9: every dropped creation came back as a replay; nothing lost, nothing twice
    assert figures["dropped_creations"] == 2 * Config().dropped_creations
    # (a retry can itself be dropped, then the next one replays: one replay for both)
    assert 1 <= figures["creation_replays"] <= figures["dropped_creations"]
    assert figures["lost"] == 0 and figures["double_created"] == 0
    assert figures["sessions_server"] == figures["sessions_client"] == 16
    assert figures["runs_server"] == figures["runs_client"] == 16
    assert figures["throttled"] >= figures["injected_429"]
    # Every fault hit one client request, which had to be sent again ...
    assert figures["retries"] >= figures["faults_total"]
    # ... and a request that executed before its answer was lost came back as a replay.
    if fired["503_after"] + fired["drop_after"]:
        assert figures["replays"] >= 1
    assert figures["injected_5xx"] <= fired["503_before"] + fired["503_after"]
    assert figures["residual_mib"] < figures["peak_traced_mib"]


def test_soak_short_counts_what_a_server_ignoring_idempotency_keys_creates_twice():
    """The lost / double-created count can fail: built with ``idempotency_key_ignored`` (LIFE-9
    broken: a retried creation creates again), each dropped creation leaves one session or run
    the client does not know, and the soak reports them."""
    figures = run_soak(Config(clients=4, cycles=1, seconds=15, seed=0, dropped_creations=2,
                              fault_kinds=("503_before",), fault_primitives=("optim_step",),
                              fault_interval=1.0, violations=("idempotency_key_ignored",)))
    assert figures["dropped_creations"] == 4
    assert figures["double_created"] >= 4
    assert figures["sessions_server"] > figures["sessions_client"]
    assert any("double-created" in p for p in figures["problems"])


def test_soak_short_catches_a_server_that_re_executes_replays():
    """The checks above can fail: built with the in-process violation ``replay_reexecutes``
    (ORD-3 broken: a replay applies its effect again), a forward_backward whose answer is lost
    after executing is applied twice when retried, and the soak must report mismatches. The
    faults fire on the first forward_backward calls (cycle 0 of 3), so the extra gradient
    always reaches a later optim_step."""
    figures = run_soak(Config(clients=4, cycles=3, seconds=15, seed=0,
                              fault_kinds=("503_after",), fault_primitives=("forward_backward",),
                              fault_skip=(0, 0), fault_interval=0.01,
                              violations=("replay_reexecutes",)))
    assert figures["faults_fired"]["503_after"] >= 1
    assert figures["mismatches"] >= 1, figures
    assert any("differs from the fault-free replay" in p for p in figures["problems"])
