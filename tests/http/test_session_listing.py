"""LIFE-10 (contract 1.1, optional feature ``session_listing``): ``GET /sessions`` and the
session view's ``runs``.

The reference is a plain list kept beside the requests (``Book``): every session created, in
order, with its owner, metadata, state and runs as the contract says they must be; each
listing is compared with that list filtered and ordered newest first. Scenarios are drawn from
``random.Random(seed)`` (two tenants, TTL expiry on a fake clock, closes, the retention window),
so a failure reproduces from its seed.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from conftest import API, KEY, MODEL, OTHER_KEY, FakeClock, expect_error

from mock_server import Features

RUN_BODY = {"base_model": MODEL, "lora": {"rank": 2, "alpha": 4.0, "seed": 1},
            "optimizer": "adamw"}
RETENTION = 5


@dataclass
class Entry:
    session_id: str
    key: str
    metadata: dict[str, str]
    expires_at: float | None
    state: str = "open"
    runs: list[tuple[str, str]] = field(default_factory=list)  # (run_id, state)
    forgotten: bool = False


@dataclass
class Book:
    """What each key owns, newest last, as the contract and the mock's retention say."""

    entries: list[Entry] = field(default_factory=list)
    closed: list[Entry] = field(default_factory=list)

    def retire(self, entry: Entry) -> None:
        self.closed.append(entry)
        while len(self.closed) > RETENTION:
            self.closed.pop(0).forgotten = True

    def expect(self, key: str, state: str | None = None,
               meta: tuple[str, str] | None = None) -> list[Entry]:
        return [e for e in reversed(self.entries) if e.key == key and not e.forgotten
                and (state is None or e.state == state)
                and (meta is None or e.metadata.get(meta[0]) == meta[1])]


def listing(client: httpx.Client, limit: int, **filters: str) -> list[dict[str, Any]]:
    """Every page of a listing, following ``next_cursor`` to the end."""
    seen: list[dict[str, Any]] = []
    params: dict[str, Any] = {"limit": limit, **filters}
    for _ in range(1000):
        response = client.get(f"{API}/sessions", params=params)
        assert response.status_code == 200, response.text
        page = response.json()
        assert set(page) == {"sessions", "next_cursor"}
        assert len(page["sessions"]) <= limit
        seen += page["sessions"]
        if page["next_cursor"] is None:
            return seen
        assert len(page["sessions"]) == limit  # a short page is the last one
        params = {**params, "cursor": page["next_cursor"]}
    raise AssertionError("the listing never ended")


def as_view(entry: Entry) -> dict[str, Any]:
    return {"session_id": entry.session_id, "state": entry.state, "metadata": entry.metadata,
            "runs": [{"run_id": r, "state": s} for r, s in entry.runs]}


def scenario(make_mock: Any, seed: int) -> tuple[Any, dict[str, httpx.Client], Book]:
    rng = random.Random(seed)
    clock = FakeClock()
    mock = make_mock(clock=clock, closed_retention=RETENTION, cancel_delay_ms=0)
    clients = {KEY: mock.client(KEY), OTHER_KEY: mock.client(OTHER_KEY)}
    book = Book()
    for _ in range(40):
        key = rng.choice([KEY, KEY, OTHER_KEY])
        client = clients[key]
        action = rng.choice(["create", "create", "create", "run", "close", "expire"])
        live = [e for e in book.entries if e.key == key and e.state == "open"]
        if action == "create" or not live:
            metadata = {"team": rng.choice(["red", "blue"])}
            if rng.random() < 0.5:
                metadata["job"] = rng.choice(["a", "b", "c"])
            ttl = rng.choice([None, None, 5])
            body: dict[str, Any] = {"metadata": metadata}
            if ttl:
                body["ttl_seconds"] = ttl
            view = client.post(f"{API}/sessions", json=body).json()
            book.entries.append(Entry(view["session_id"], key, metadata,
                                      None if ttl is None else clock.now + ttl))
        elif action == "run":
            entry = rng.choice(live)
            run = client.post(f"{API}/sessions/{entry.session_id}/runs", json=RUN_BODY).json()
            entry.runs.append((run["run_id"], "active"))
            if rng.random() < 0.5:  # cancelled runs read cancelled (cancel_delay_ms 0)
                client.post(f"{API}/runs/{run['run_id']}/cancel", json={})
                entry.runs[-1] = (run["run_id"], "cancelled")
        elif action == "close":
            entry = rng.choice(live)
            for run_id, state in entry.runs:
                if state == "active":
                    client.post(f"{API}/runs/{run_id}/finish", json={})
            entry.runs = [(r, "finished" if s == "active" else s) for r, s in entry.runs]
            assert client.post(f"{API}/sessions/{entry.session_id}/close",
                               json={}).status_code == 200
            entry.state = "closed"
            book.retire(entry)
        else:
            clock.advance(6)
            for entry in book.entries:  # creation order, as the server sweeps
                if entry.state == "open" and entry.expires_at is not None \
                        and clock.now >= entry.expires_at:
                    entry.state = "expired"
                    entry.runs = [(r, "cancelled" if s == "active" else s)
                                  for r, s in entry.runs]
                    book.retire(entry)
    return mock, clients, book


def comparable(views: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v[k] for k in ("session_id", "state", "metadata", "runs")} for v in views]


@pytest.mark.parametrize("seed", range(6))
def test_listing_equals_the_book_for_every_filter_and_page_size(make_mock, seed) -> None:
    mock, clients, book = scenario(make_mock, seed)
    filters: list[dict[str, str]] = [{}, {"state": "open"}, {"state": "closed"},
                                     {"state": "expired"},
                                     {"metadata_key": "team", "metadata_value": "red"},
                                     {"metadata_key": "job", "metadata_value": "b"},
                                     {"state": "open", "metadata_key": "team",
                                      "metadata_value": "blue"}]
    for key, client in clients.items():
        for flt in filters:
            meta = (flt["metadata_key"], flt["metadata_value"]) if "metadata_key" in flt \
                else None
            expected = [as_view(e) for e in book.expect(key, flt.get("state"), meta)]
            for limit in (1, 2, 3, 50):
                assert comparable(listing(client, limit, **flt)) == expected, (key, flt, limit)
    # every listed view is exactly GET /sessions/{sid}
    for client in clients.values():
        for view in listing(client, 7):
            assert client.get(f"{API}/sessions/{view['session_id']}").json() == view


def test_another_keys_sessions_never_appear(make_mock) -> None:
    mock, clients, book = scenario(make_mock, 11)
    for key, client in clients.items():
        ids = {v["session_id"] for v in listing(client, 4)}
        assert ids and all(mock.backend.sessions[sid].key == key for sid in ids)
        others = {e.session_id for e in book.entries if e.key != key}
        assert not ids & others


def test_a_cursor_is_stable_while_sessions_are_created(mock, client) -> None:
    """Newest first: sessions created after the first page are newer than its cursor, so the
    following pages neither repeat nor skip anything."""
    created = [client.post(f"{API}/sessions", json={}).json()["session_id"] for _ in range(5)]
    first = client.get(f"{API}/sessions", params={"limit": 2}).json()
    assert [v["session_id"] for v in first["sessions"]] == created[::-1][:2]
    for _ in range(3):
        client.post(f"{API}/sessions", json={})
    rest = client.get(f"{API}/sessions", params={"limit": 10,
                                                  "cursor": first["next_cursor"]}).json()
    assert [v["session_id"] for v in rest["sessions"]] == created[::-1][2:]
    assert rest["next_cursor"] is None


def test_session_view_lists_its_runs_with_settled_states(make_mock) -> None:
    clock = FakeClock()
    mock = make_mock(clock=clock, cancel_delay_ms=50)
    client = mock.client(KEY)
    sid = client.post(f"{API}/sessions", json={}).json()["session_id"]
    runs = [client.post(f"{API}/sessions/{sid}/runs", json=RUN_BODY).json()["run_id"]
            for _ in range(3)]
    client.post(f"{API}/runs/{runs[1]}/cancel", json={})
    client.post(f"{API}/runs/{runs[2]}/finish", json={})
    view = client.get(f"{API}/sessions/{sid}").json()
    assert view["runs"] == [{"run_id": runs[0], "state": "active"},
                            {"run_id": runs[1], "state": "cancelling"},
                            {"run_id": runs[2], "state": "finished"}]
    clock.advance(0.06)
    assert client.get(f"{API}/sessions/{sid}").json()["runs"][1]["state"] == "cancelled"


@pytest.mark.parametrize("params,error_type", [
    ({"state": "running"}, "validation_error"),
    ({"limit": "0"}, "validation_error"),
    ({"limit": "201"}, "validation_error"),
    ({"limit": "ten"}, "validation_error"),
    ({"limit": "-1"}, "validation_error"),
    ({"limit": "99999999999999999999999"}, "validation_error"),
    ({"metadata_key": "team"}, "validation_error"),
    ({"metadata_value": "red"}, "validation_error"),
    ({"cursor": "not-a-cursor"}, "validation_error"),
    ({"cursor": "djE6eDp5"}, "validation_error"),  # base64 of "v1:x:y"
    ({"stat": "open"}, "unknown_field"),
    ([("state", "open"), ("state", "closed")], "validation_error"),
])
def test_bad_listing_parameters_are_422(mock, client, params, error_type) -> None:
    client.post(f"{API}/sessions", json={})
    expect_error(client.get(f"{API}/sessions", params=params), 422, error_type)


def test_a_cursor_belongs_to_its_filters(mock, client) -> None:
    for team in ("red", "red", "blue"):
        client.post(f"{API}/sessions", json={"metadata": {"team": team}})
    page = client.get(f"{API}/sessions", params={"limit": 1}).json()
    moved = client.get(f"{API}/sessions", params={"limit": 1, "state": "open",
                                                   "cursor": page["next_cursor"]})
    assert "filters" in expect_error(moved, 422, "validation_error")["message"]


def test_without_the_feature_there_is_no_listing_and_no_runs(make_mock) -> None:
    mock = make_mock(features=Features(session_listing=False))
    client = mock.client(KEY)
    view = client.post(f"{API}/sessions", json={}).json()
    assert "runs" not in view
    expect_error(client.get(f"{API}/sessions"), 405, "method_not_allowed")
