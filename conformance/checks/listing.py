"""LIFE-10 (contract 1.1, optional: session_listing): ``GET /sessions`` and the session view's
``runs``.

The reference is what the check itself created: sessions tagged with a metadata pair no one
else uses (``wc-probe``), in creation order. A listing filtered by that pair must be exactly
those, newest first, the same whatever the page size; another key's listing never shows them.
"""

from __future__ import annotations

import uuid
from typing import Any

from ..context import Ctx, SessionHandle, expect_status, same_view
from ..registry import CheckFailed, CheckUnsupported, check
from ..wire import PRIMARY, SECOND

CAPABILITY = "features.session_listing"
MAX_PAGES = 50


def pages(ctx: Ctx, *, auth: str = PRIMARY, limit: int, **filters: str
          ) -> tuple[list[dict[str, Any]], int]:
    """Every page of a listing, following ``next_cursor``; the views and the number of pages."""
    views: list[dict[str, Any]] = []
    params: dict[str, str | int] = {"limit": limit, **filters}
    for page in range(1, MAX_PAGES + 1):
        reply = expect_status(ctx.wire.call("GET", "/sessions", auth=auth, params=params), 200,
                              what=f"GET /sessions page {page} ({params})")
        body = reply.body
        if not isinstance(body, dict) or not isinstance(body.get("sessions"), list) \
                or "next_cursor" not in body:
            raise CheckFailed(f"GET /sessions answered {body!r}, not {{sessions, next_cursor}}")
        if len(body["sessions"]) > limit:
            raise CheckFailed(f"page {page} holds {len(body['sessions'])} sessions, limit {limit}")
        views += body["sessions"]
        cursor = body["next_cursor"]
        if cursor is None:
            return views, page
        if not isinstance(cursor, str) or not cursor:
            raise CheckFailed(f"next_cursor is {cursor!r}, not a string or null")
        params = {**params, "cursor": cursor}
    raise CheckFailed(f"the listing did not end within {MAX_PAGES} pages of {limit}")


def _ids(views: list[dict[str, Any]]) -> list[str]:
    return [str(v.get("session_id")) for v in views if isinstance(v, dict)]


def _probe_sessions(ctx: Ctx, n: int, probe: str, auth: str = PRIMARY) -> list[SessionHandle]:
    return [ctx.session(fresh=True, auth=auth, metadata={"wc-probe": probe, "wc-n": str(i)})
            for i in range(n)]


@check("LIFE-10", "pages", capability=CAPABILITY, title="GET /sessions lists the caller's "
       "sessions newest first, filtered by state and a metadata pair, the same for any page "
       "size; cursors neither repeat nor skip, even while sessions are created; the session "
       "view lists its runs")
def life10_pages(ctx: Ctx) -> None:
    probe = uuid.uuid4().hex[:16]
    made = _probe_sessions(ctx, 4, probe)
    newest_first = [s.id for s in reversed(made)]
    meta = {"metadata_key": "wc-probe", "metadata_value": probe}
    run = ctx.run(session=made[1])
    closed = made[2]
    expect_status(ctx.wire.call("POST", f"/sessions/{closed.id}/close", {}), 200,
                  what="close a session")
    for limit in (1, 2, 3, 50):
        views, count = pages(ctx, limit=limit, **meta)
        if _ids(views) != newest_first:
            raise CheckFailed(f"limit {limit}: the probe's sessions listed as {_ids(views)}, "
                              f"created (newest first) {newest_first}")
        if limit == 1 and count != len(made):
            raise CheckFailed(f"limit 1 took {count} pages for {len(made)} sessions")
    views, _ = pages(ctx, limit=50, **meta)
    for view in views:
        got = expect_status(ctx.wire.call("GET", f"/sessions/{view['session_id']}"), 200).body
        if not same_view(view, got) or view.get("runs") != got.get("runs"):
            raise CheckFailed(f"listed view {view} differs from GET /sessions/{{sid}} {got}")
    by_id = {v["session_id"]: v for v in views}
    runs = by_id[made[1].id].get("runs")
    if not (isinstance(runs, list) and len(runs) == 1 and isinstance(runs[0], dict)
            and (runs[0].get("run_id"), runs[0].get("state")) == (run.id, "active")):
        raise CheckFailed(f"the session view lists runs {runs}, expected [{run.id}: active]")
    if by_id[made[0].id].get("runs") != []:
        raise CheckFailed(f"a session without runs lists {by_id[made[0].id].get('runs')}")
    for state, expected in (("closed", [closed.id]),
                            ("open", [s for s in newest_first if s != closed.id])):
        views, _ = pages(ctx, limit=2, state=state, **meta)
        if _ids(views) != expected:
            raise CheckFailed(f"state={state}: listed {_ids(views)}, expected {expected}")
        if any(v.get("state") != state for v in views):
            raise CheckFailed(f"state={state} listed a session in another state: {views}")
    # a cursor taken before new sessions are created continues where it was
    first = expect_status(ctx.wire.call("GET", "/sessions", params={"limit": 2, **meta}), 200,
                          what="first page").body
    later = _probe_sessions(ctx, 2, probe)
    rest, _ = pages(ctx, limit=1, cursor=first["next_cursor"], **meta)
    if _ids(first["sessions"]) + _ids(rest) != newest_first:
        raise CheckFailed(f"with {len(later)} sessions created between pages the listing read "
                          f"{_ids(first['sessions']) + _ids(rest)}, expected {newest_first}")
    views, _ = pages(ctx, limit=50, **meta)
    if _ids(views) != [s.id for s in reversed(later)] + newest_first:
        raise CheckFailed("sessions created later are not listed first")
    expect_status(ctx.wire.call("GET", "/sessions", params={"state": "running"}), 422,
                  what="state=running")
    expect_status(ctx.wire.call("GET", "/sessions", params={"limit": 0}), 422, what="limit=0")
    expect_status(ctx.wire.call("GET", "/sessions", params={"wc-probe": probe}), 422,
                  "unknown_field", what="an unknown query parameter")


@check("LIFE-10", "isolation", capability=CAPABILITY, needs_second_key=True,
       title="another API key's sessions never appear in a listing (SEC-2), with or without "
       "filters")
def life10_isolation(ctx: Ctx) -> None:
    if not ctx.wire.target.second_api_key:
        raise CheckUnsupported("no second API key (--second-api-key / WHITNEY_SECOND_API_KEY)")
    probe = uuid.uuid4().hex[:16]
    mine = {s.id for s in _probe_sessions(ctx, 2, probe)}
    theirs = {s.id for s in _probe_sessions(ctx, 1, probe, auth=SECOND)}
    meta = {"metadata_key": "wc-probe", "metadata_value": probe}
    for auth, own, other in ((PRIMARY, mine, theirs), (SECOND, theirs, mine)):
        views, _ = pages(ctx, auth=auth, limit=50, **meta)
        if set(_ids(views)) != own:
            raise CheckFailed(f"{auth} key's listing of the probe shows {sorted(_ids(views))}; "
                              f"it owns {sorted(own)}, the other key {sorted(other)}")
        run_views, _ = pages(ctx, auth=auth, limit=50, metadata_key="whitney-conformance-run",
                             metadata_value=ctx.run_tag)
        leaked = set(_ids(run_views)) & {t.session_id for t in ctx.wire.tracker.sessions.values()
                                         if t.key != auth}
        if leaked:
            raise CheckFailed(f"{auth} key's listing shows the other key's sessions "
                              f"{sorted(leaked)}")
        first = expect_status(ctx.wire.call("GET", "/sessions", auth=auth,
                                            params={"limit": 200}), 200).body
        shown = set(_ids(first.get("sessions", [])))
        if shown & other:
            raise CheckFailed(f"{auth} key's unfiltered listing shows the other key's sessions "
                              f"{sorted(shown & other)}")
