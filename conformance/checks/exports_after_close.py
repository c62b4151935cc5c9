"""EXPORT-2 (contract 1.1, optional: exports_after_close): an export downloads after its run
finished and its session closed (the seed's order is save_state -> export_lora -> finish ->
close), byte for byte as before; the session's checkpoints still load into another run of the
key. When the closed session is evicted is the server's (its retention), so not checked here.
"""

from __future__ import annotations

import hashlib

from ..context import Ctx, expect_status
from ..payloads import ce_datum
from ..registry import CheckFailed, CheckWarning, check


@check("EXPORT-2", "after-close", capability="features.exports_after_close",
       title="after finish and close, the export's files download as they did before, and the "
       "session's checkpoint loads into another run of the key")
def export2_after_close(ctx: Ctx) -> None:
    if not ctx.has_primitive("export_lora"):
        raise CheckWarning("not exercised: features.exports_after_close is declared but "
                           "export_lora is not (no export to keep)")
    session = ctx.session(fresh=True)
    run = ctx.run(session=session)
    run.forward([ce_datum(ctx.tokens("keep me"))], backward=True)
    run.step()
    checkpoint = run.body("save_state", {"name": "after-close"}) \
        if ctx.has_primitive("save_state") else None
    # What the run served while open is the reference (whether that matches the listing is
    # EXPORT-1's business); two exports of different weights must differ, so that a server
    # serving the same bytes whatever it exports cannot pass.
    served: dict[str, bytes] = {}
    exports = []
    for round_ in range(2):
        if round_:
            run.forward([ce_datum(ctx.tokens("and move"))], backward=True)
            run.step()
        export = run.body("export_lora")
        files = {}
        for entry in export.get("files") or []:
            path = f"/runs/{run.id}/exports/{export['export_id']}/{entry['name']}"
            files[path] = expect_status(ctx.wire.call("GET", path), 200,
                                        what=f"download {entry['name']} before close").content
        served.update(files)
        exports.append(sorted(files.values()))
    if exports[0] == exports[1]:
        raise CheckFailed("two exports of different weights (an optimizer step apart) served "
                          "the same bytes; downloads after close would prove nothing")
    expect_status(ctx.wire.call("POST", f"/runs/{run.id}/finish", {}), 200, what="finish")
    expect_status(ctx.wire.call("POST", f"/sessions/{session.id}/close", {}), 200, what="close")
    for path, before in served.items():
        reply = expect_status(ctx.wire.call("GET", path), 200, what=f"{path} after close")
        if reply.content != before:
            raise CheckFailed(f"{path} after close: {len(reply.content)} bytes sha256 "
                              f"{hashlib.sha256(reply.content).hexdigest()}, before close "
                              f"{len(before)} bytes {hashlib.sha256(before).hexdigest()}")
    if checkpoint is not None and ctx.has_primitive("load_state"):
        loader = ctx.run()
        loaded = loader.body("load_state", {"checkpoint_id": checkpoint["checkpoint_id"],
                                            "with_optimizer": True})
        if loaded.get("step") != checkpoint["step"]:
            raise CheckFailed(f"load_state of the closed session's checkpoint answered "
                              f"{loaded}, saved at step {checkpoint['step']}")
