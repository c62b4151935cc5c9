"""Expiry and memory (LIFE-2, LIFE-3, LIFE-4): what a session holds is given back.

- An expired session's runs read ``cancelled`` and the weights they held (sampler versions,
  gradient buffer, AdamW moments) are freed at once; what is kept for ORD-3 replays (the
  operation records and the current adapter) goes when the session leaves the closed-session
  retention window, after which memory is back to where it was before the session existed.
- 10,000 create/run/close-or-expire cycles leave memory flat (Backend methods called
  directly, one event loop), and so do a few hundred cycles over HTTP.

Memory is measured with ``tracemalloc`` (numpy reports its buffers to it), in this process,
around code that runs synchronously; ``gc.collect()`` first so cycles do not count.
"""

from __future__ import annotations

import asyncio
import gc
import tracemalloc
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest
from conftest import API, KEY, MODEL, FakeClock, ce_datum, expect_error, new_run, text_tokens

from mock_server import Backend
from mock_server.backend import schemas
from mock_server.backend.primitives import PRIMITIVES

RANK = 64  # the largest adapter: its arrays dominate whatever else a run holds
VERSIONS = 20


@contextmanager
def traced() -> Iterator[None]:
    tracemalloc.start()
    try:
        yield
    finally:
        tracemalloc.stop()


def traced_now() -> int:
    gc.collect()
    return tracemalloc.get_traced_memory()[0]


def lora_bytes(backend: Any, run_id: str) -> int:
    return sum(a.nbytes for a in backend.runs[run_id].lora.params.values())


def cycle_empty_sessions(client: Any, n: int) -> None:
    for _ in range(n):
        sid = client.post(f"{API}/sessions", json={}).json()["session_id"]
        assert client.post(f"{API}/sessions/{sid}/close", json={}).status_code == 200


def test_life_4_expired_session_runs_are_cancelled_and_their_memory_freed(make_mock):
    clock = FakeClock()
    mock = make_mock(clock=clock)
    # A small closed-session window so eviction takes a few closes, not the default 256; the
    # window's size changes when memory comes back, not whether it does.
    window = 4
    mock.backend.closed_retention = window
    client = mock.client(KEY)

    def heavy_run() -> Any:
        handle = new_run(client, rank=RANK, alpha=16.0, ttl_seconds=30)
        for version in range(VERSIONS):
            handle.save(version)
        handle.forward_backward([ce_datum(text_tokens("weights to free"))])
        handle.optim_step()
        handle.forward_backward([ce_datum(text_tokens("and a gradient"))])
        return handle

    def steady_state() -> None:
        """Bring every bounded cache to the same full state, then empty the closed-session
        window: done before the baseline and again at the end, so both count the same
        things. The base model keeps the compiled weights of its last few adapters whether
        or not their runs still exist; eight optimizer steps turn that cache over."""
        churn = new_run(client, rank=2, lora_seed=7)
        for _ in range(8):
            churn.forward_backward([ce_datum(text_tokens("turn the cache over"))])
            churn.optim_step()
        assert client.post(churn.url("finish"), json={}).status_code == 200
        assert client.post(f"{API}/sessions/{churn.session_id}/close",
                           json={}).status_code == 200
        cycle_empty_sessions(client, window + 1)

    # Warm every cache on the path once (pydantic, numpy, the base model), untraced.
    heavy_run()
    clock.advance(31)
    steady_state()

    with traced():
        steady_state()
        base = traced_now()
        handle = heavy_run()
        per_adapter = lora_bytes(mock.backend, handle.run_id)
        loaded = traced_now() - base
        # versions + gradient buffer + two AdamW moments, all the adapter's size
        heavy = (VERSIONS + 3) * per_adapter
        assert loaded >= heavy, (loaded, heavy)

        clock.advance(29)
        assert client.post(f"{API}/sessions/{handle.session_id}/heartbeat",
                           json={}).status_code == 200
        clock.advance(29)  # alive only thanks to the heartbeat (LIFE-2)
        assert handle.view()["state"] == "active"
        clock.advance(2)  # expires_at passes without a heartbeat (LIFE-4)
        assert client.get(f"{API}/sessions/{handle.session_id}").json()["state"] == "expired"
        view = handle.view()
        assert view["state"] == "cancelled" and view["versions"] == []
        freed = loaded - (traced_now() - base)
        assert freed >= (VERSIONS + 2) * per_adapter, (freed, per_adapter)
        # ORD-3: the records are still answered while the session is retained
        replay = client.post(handle.url("save_weights_for_sampler"),
                             json={"seq": 1, "version": 0})
        assert replay.status_code == 200 and replay.headers["Whitney-Replayed"] == "true"

        steady_state()  # pushes the expired session out of the window
        expect_error(client.get(f"{API}/sessions/{handle.session_id}"), 404)
        expect_error(client.get(handle.url()), 404)
        residual = traced_now() - base
    # Back to baseline: within a small fraction of one adapter, against ~23 adapters loaded.
    assert residual < per_adapter // 2, (residual, per_adapter)


# -- what one operation record costs ------------------------------------------------------------
def test_ord_3_an_operation_record_costs_about_its_payload():
    """ORD-3 keeps every record as long as the run; each must cost about its own size."""
    backend = Backend(api_keys=(KEY,))
    session = backend.create_session(key=KEY, body=NO_TTL)
    run_id = backend.create_run(key=KEY, session_id=session["session_id"],
                                body=CREATE_RUN)["run_id"]
    ops = 300

    async def record(seq: int, primitive: str, payload: dict[str, Any]) -> None:
        body = PRIMITIVES[primitive].body.model_validate(payload)
        outcome = await backend.submit(key=KEY, run_id=run_id, primitive=primitive, body=body,
                                       digest=schemas.canonical_digest(payload))
        assert outcome.status == 200

    async def main() -> tuple[int, int]:
        await record(1, "save_weights_for_sampler", {"seq": 1, "version": 0})
        await record(2, "logprobs", {"seq": 2, "version": 0, "token_ids": [256, 97]})
        with traced():
            before = traced_now()
            for seq in range(3, 3 + ops):
                await record(seq, "logprobs", {"seq": seq, "version": 0, "token_ids": [256, 97]})
            return before, traced_now()

    before, after = asyncio.run(main())
    payload = len(backend.runs[run_id].ops[3].payload)
    assert payload < 100
    per_op = (after - before) / ops
    # the payload, its 32-byte digest, the Operation object and its dict slot: well under 1 KiB
    assert per_op < payload + 1024, per_op


# -- 10,000 cycles, Backend methods directly ---------------------------------------------------
CREATE_RUN = schemas.CreateRun.model_validate(
    {"base_model": MODEL, "lora": {"rank": 2, "alpha": 4.0, "seed": 0}, "optimizer": "adamw"})
NO_TTL = schemas.CreateSession.model_validate({})
TTL = schemas.CreateSession.model_validate({"ttl_seconds": 1})


async def one_cycle(backend: Backend, clock: FakeClock, i: int) -> None:
    """Create a session and a run, execute one primitive, then close it (even i) or let it
    expire (odd i); every tenth cycle also leaves a request held until ``seq_gap``."""
    backend.tick()
    session = backend.create_session(key=KEY, body=TTL if i % 2 else NO_TTL)
    run = backend.create_run(key=KEY, session_id=session["session_id"], body=CREATE_RUN)
    payload = {"seq": 1, "version": 0}
    outcome = await backend.submit(
        key=KEY, run_id=run["run_id"], primitive="save_weights_for_sampler",
        body=schemas.SaveWeightsForSampler.model_validate(payload),
        digest=schemas.canonical_digest(payload))
    assert outcome.status == 200
    if i % 10 == 0:
        gap = {"seq": 3, "version": 1}
        with pytest.raises(Exception) as refused:
            await backend.submit(
                key=KEY, run_id=run["run_id"], primitive="save_weights_for_sampler",
                body=schemas.SaveWeightsForSampler.model_validate(gap),
                digest=schemas.canonical_digest(gap))
        assert getattr(refused.value, "type", None) == "seq_gap"
    if i % 2:
        clock.advance(2)
        backend.tick()
        assert backend.runs[run["run_id"]].state == "cancelled"
    else:
        backend.finish_run(key=KEY, run_id=run["run_id"])
        backend.close_session(key=KEY, session_id=session["session_id"])


def test_ten_thousand_create_close_cycles_leave_memory_flat():
    clock = FakeClock()
    from mock_server import Limits

    backend = Backend(api_keys=(KEY,), clock=clock, limits=Limits(order_wait_ms=0))
    window = backend.closed_retention
    checkpoints: dict[int, int] = {}

    async def main() -> None:
        for i in range(window + 100):  # fill the retention window before measuring
            await one_cycle(backend, clock, i)
        with traced():
            i = window + 100
            for mark in (2_000, 4_000, 6_000, 8_000, 10_000):
                while i < mark:
                    await one_cycle(backend, clock, i)
                    i += 1
                checkpoints[mark] = traced_now()

    asyncio.run(main())
    assert len(backend.sessions) <= window and len(backend.runs) <= window
    assert not any(run.held for run in backend.runs.values())
    values = np.array(list(checkpoints.values()))
    # From 2,000 to 10,000 cycles: growth under 8 bytes per cycle (a leaked run would cost
    # kilobytes per cycle, a leaked view dict hundreds of bytes).
    assert values.max() - values[0] < 64 * 1024, checkpoints


def test_http_create_close_cycles_leave_memory_flat(make_mock):
    """Also what contract 1.1 keeps until a closed session is evicted: its exports, downloaded
    after close or expiry (EXPORT-2), and its remembered creations (LIFE-9, every creation
    here carries an Idempotency-Key and is retried once as a replay)."""
    clock = FakeClock()
    mock = make_mock(clock=clock, order_wait_ms=1)
    mock.backend.closed_retention = 16  # see the expiry test: a smaller window, same logic
    client = mock.client(KEY)
    body = {"base_model": MODEL, "lora": {"rank": 2, "alpha": 4.0, "seed": 0},
            "optimizer": "adamw"}

    def create(path: str, payload: dict[str, Any], key: str) -> dict[str, Any]:
        first = client.post(path, json=payload, headers={"Idempotency-Key": key})
        again = client.post(path, json=payload, headers={"Idempotency-Key": key})
        assert first.status_code == 201 and again.headers["whitney-replayed"] == "true"
        assert again.content == first.content
        view: dict[str, Any] = first.json()
        return view

    def cycle(i: int) -> None:
        session = create(f"{API}/sessions", {"ttl_seconds": 1} if i % 2 else {},
                         f"s-{i}")["session_id"]
        run = create(f"{API}/sessions/{session}/runs", body, f"r-{i}")["run_id"]
        saved = client.post(f"{API}/runs/{run}/save_weights_for_sampler",
                            json={"seq": 1, "version": 0})
        assert saved.status_code == 200, saved.text
        export = client.post(f"{API}/runs/{run}/export_lora", json={"seq": 2}).json()
        if i % 5 == 0:
            expect_error(client.post(f"{API}/runs/{run}/logprobs",
                                     json={"seq": 4, "version": 0, "token_ids": [1, 2]}),
                         409, "seq_gap")
        if i % 2:
            clock.advance(2)
            assert client.get(f"{API}/runs/{run}").json()["state"] == "cancelled"
        else:
            assert client.post(f"{API}/runs/{run}/finish", json={}).status_code == 200
            assert client.post(f"{API}/sessions/{session}/close", json={}).status_code == 200
        for entry in export["files"]:  # EXPORT-2: after close (or expiry), as listed
            data = client.get(f"{API}/runs/{run}/exports/{export['export_id']}/{entry['name']}")
            assert data.status_code == 200 and len(data.content) == entry["bytes"]

    for i in range(300):  # warm-up: window full, every cache on the path filled
        cycle(i)
    with traced():
        for i in range(300, 400):
            cycle(i)
        first = traced_now()
        for i in range(400, 600):
            cycle(i)
        last = traced_now()
    assert len(mock.backend.sessions) <= 16
    # 200 cycles; a leaked session with its run would be ~10 KB each, 2 MB in all.
    assert last - first < 96 * 1024, (first, last)
