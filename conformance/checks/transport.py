"""TRANSPORT-1: X-Request-Id on every response, echoed or generated."""

from __future__ import annotations

from typing import Any

from ..context import Ctx
from ..registry import CheckFailed, Level, check
from ..wire import NO_AUTH


@check("TRANSPORT-1", "echo", title="X-Request-Id echoes the client's value on success and "
       "on every error status")
def transport1_echo(ctx: Ctx) -> None:
    session = ctx.session()
    probes: list[tuple[str, str, Any, dict[str, Any]]] = [
        ("GET", "/capabilities", None, {}),
        ("GET", "/capabilities", None, {"auth": NO_AUTH}),
        ("GET", f"/sessions/{session.id}", None, {}),
        ("GET", "/runs/run-that-does-not-exist", None, {}),
        ("POST", "/sessions", None, {"content": b"{not json"}),
        ("POST", "/sessions", {"metadata": ctx.tag(), "no_such_field": 1}, {}),
        ("POST", f"/sessions/{session.id}/runs", {"base_model": "no/such-model",
                                                   "lora": {"rank": 1, "alpha": 1.0},
                                                   "optimizer": "adamw"}, {}),
    ]
    for i, (method, path, body, extra) in enumerate(probes):
        request_id = f"conformance-{ctx.run_tag}-{i}"
        kwargs = dict(extra)
        kwargs.setdefault("headers", {})["X-Request-Id"] = request_id
        reply = ctx.wire.call(method, path, body, **kwargs)
        echoed = reply.headers.get("x-request-id")
        if echoed != request_id:
            raise CheckFailed(f"{reply.describe()}: X-Request-Id {echoed!r}, sent {request_id!r}")


@check("TRANSPORT-1", "generated-unique", level=Level.SHOULD,
       title="X-Request-Id the server generates differs between responses")
def transport1_unique(ctx: Ctx) -> None:
    ids = [ctx.wire.call("GET", "/capabilities").headers.get("x-request-id") for _ in range(4)]
    if any(not value for value in ids):
        raise CheckFailed(f"missing X-Request-Id in {ids}")
    if len(set(ids)) != len(ids):
        raise CheckFailed(f"generated request ids repeat: {ids}")


@check("TRANSPORT-1", "every-response", run_last=True,
       title="every response the suite received carried X-Request-Id")
def transport1_every_response(ctx: Ctx) -> None:
    problems = ctx.wire.request_id_problems
    if problems:
        shown = "; ".join(f"[{cid}] {text}" for cid, text in problems[:5])
        raise CheckFailed(f"{len(problems)} response(s) without X-Request-Id: {shown}")
