"""ORD-6 (contract 1.1, optional: seq_error_details): every primitive error says where the run's
sequence stands, ``details.next_seq`` and ``details.seq_consumed``.

The reference is ORD-4 applied by the check: refusals before the turn consume nothing, a failure
at the turn consumes its seq; ``GET /runs/{rid}`` must then read the ``next_seq`` the error said.
"""

from __future__ import annotations

from typing import Any

from ..context import Ctx, RunHandle
from ..payloads import adamw, ce_datum, loss_body
from ..registry import CheckFailed, check
from ..wire import Reply

CAPABILITY = "features.seq_error_details"


def _says(ctx: Ctx, run: RunHandle, reply: Reply, what: str, *, consumed: bool) -> None:
    """``reply``'s details against ORD-4 as the handle applied it: ``consumed`` is whether the
    request took its seq, and the run's next seq is the handle's."""
    if reply.status < 400:
        raise CheckFailed(f"{what}: expected an error, got {reply.describe()}")
    next_seq = run.seq
    details = reply.error_details
    got = (details.get("next_seq"), details.get("seq_consumed"))
    if got != (next_seq, consumed) or type(details.get("seq_consumed")) is not bool:
        raise CheckFailed(f"{what} ({reply.status} {reply.error_type}): details.next_seq, "
                          f"details.seq_consumed are {got!r}; ORD-4 says ({next_seq}, "
                          f"{consumed})")
    read = run.get()["next_seq"]
    if read != next_seq:
        raise CheckFailed(f"{what}: the error said next_seq {next_seq}, GET /runs reads {read}")


def _send(ctx: Ctx, run: RunHandle, what: str, name: str, body: dict[str, Any] | None = None,
          **kwargs: Any) -> Reply:
    """Send a primitive expected to fail and check its details. Whether it consumed its seq
    follows from what the server answered (ORD-4), not from what the check expected: a server
    that executes a request the check meant to be refused is another rule's failure (OPT-1 for
    an empty adamw), and its details are judged for what it did."""
    before = run.seq
    reply = run.prim(name, body, expect=None, **kwargs)
    _says(ctx, run, reply, what, consumed=run.seq != before)
    return reply


@check("ORD-6", "seq-details", capability=CAPABILITY, title="every primitive error carries "
       "details.next_seq and details.seq_consumed: refusals before the turn (400, 409 "
       "seq_conflict, 422) false, failures at the turn (404 version_not_found, 409 "
       "no_gradients) true, replays as recorded, terminal runs too")
def ord6_seq_details(ctx: Ctx) -> None:
    run = ctx.run()
    first: dict[str, Any] = loss_body([ce_datum(ctx.tokens("seq state"))])
    run.prim("forward", first)  # seq 1
    _send(ctx, run, "422 (empty adamw)", "optim_step", {"adamw": {}})
    _send(ctx, run, "400 (truncated body)", "optim_step",
          raw=b'{"seq": %d, "adamw": ' % run.seq)
    other = loss_body([ce_datum(ctx.tokens("another body"))])
    _send(ctx, run, "409 seq_conflict", "forward", other, seq=1)
    failed_seq = run.seq
    failed = run.prim("optim_step", {"adamw": adamw()}, expect=(409, "no_gradients"))
    _says(ctx, run, failed, "409 no_gradients at its turn", consumed=True)
    sample = ctx.sample_body(9, ctx.tokens("Q"), max_tokens=1)
    missing = run.prim("sample", sample, expect=(404, "version_not_found"))
    _says(ctx, run, missing, "404 version_not_found at its turn", consumed=True)
    replay = run.prim("optim_step", {"adamw": adamw()}, seq=failed_seq, expect=None)
    if not replay.replayed or replay.body != failed.body:
        raise CheckFailed(f"the replay of a recorded failure answered {replay.describe()} "
                          f"{replay.body}, recorded {failed.body}")
    run.prim("forward", first)  # the sequence goes on where the errors said
    reply = ctx.wire.call("POST", f"/runs/{run.id}/finish", {})
    if reply.status != 200:
        raise CheckFailed(f"finish: {reply.describe()}")
    _send(ctx, run, "409 run_not_active (finished)", "forward", first)
