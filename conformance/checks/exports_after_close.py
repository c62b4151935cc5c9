"""EXPORT-2 (contract 1.1, optional: exports_after_close): an export downloads after its run
finished and its session closed (the seed's order is save_state -> export_lora -> finish ->
close), byte for byte as listed; the session's checkpoints still load into another run of the
key. When the closed session is evicted is the server's (its retention), so not checked here.
"""

from __future__ import annotations

import hashlib

from ..context import Ctx, expect_status
from ..payloads import ce_datum
from ..registry import CheckFailed, check


@check("EXPORT-2", "after-close", capability="features.exports_after_close",
       title="after finish and close, the export's files download with the listed size and "
       "sha256, and the session's checkpoint loads into another run of the key")
def export2_after_close(ctx: Ctx) -> None:
    if not ctx.has_primitive("export_lora"):
        raise CheckFailed("features.exports_after_close is declared without export_lora")
    session = ctx.session(fresh=True)
    run = ctx.run(session=session)
    run.forward([ce_datum(ctx.tokens("keep me"))], backward=True)
    run.step()
    checkpoint = run.body("save_state", {"name": "after-close"}) \
        if ctx.has_primitive("save_state") else None
    export = run.body("export_lora")
    expect_status(ctx.wire.call("POST", f"/runs/{run.id}/finish", {}), 200, what="finish")
    expect_status(ctx.wire.call("POST", f"/sessions/{session.id}/close", {}), 200, what="close")
    for entry in export.get("files") or []:
        reply = ctx.wire.call("GET", f"/runs/{run.id}/exports/{export['export_id']}/"
                                     f"{entry['name']}")
        expect_status(reply, 200, what=f"download {entry['name']} after close")
        digest = hashlib.sha256(reply.content).hexdigest()
        if len(reply.content) != entry["bytes"] or digest != entry["sha256"]:
            raise CheckFailed(f"{entry['name']} after close: {len(reply.content)} bytes sha256 "
                              f"{digest}, listed {entry['bytes']} bytes {entry['sha256']}")
    if checkpoint is not None and ctx.has_primitive("load_state"):
        loader = ctx.run()
        loaded = loader.body("load_state", {"checkpoint_id": checkpoint["checkpoint_id"],
                                            "with_optimizer": True})
        if loaded.get("step") != checkpoint["step"]:
            raise CheckFailed(f"load_state of the closed session's checkpoint answered "
                              f"{loaded}, saved at step {checkpoint['step']}")
