"""SCHEMA-1 (every response the suite received matches openapi.yaml) and SCHEMA-2 (fuzz)."""

from __future__ import annotations

from ..context import Ctx
from ..fuzz import fuzz_operations
from ..payloads import ce_datum
from ..registry import CheckFailed, CheckWarning, check


def _shown(problems: list[tuple[str, str]]) -> str:
    return "; ".join(f"[{cid}] {text}" for cid, text in problems[:6])


@check("SCHEMA-1", "every-response", run_last=True, title="every response of every check "
       "matches openapi.yaml: documented status, required headers, content type, body schema "
       "(strict profile: also the mock's closed objects, error types and details keys)")
def schema1_every_response(ctx: Ctx) -> None:
    if ctx.wire.openapi is None:
        raise CheckWarning("no openapi.yaml loaded (--no-schema)")
    problems = ctx.wire.schema_problems
    if problems:
        raise CheckFailed(f"{len(problems)} response(s) do not match {ctx.wire.openapi.source}:"
                          f" {_shown(problems)}")
    strict = ctx.wire.strict_problems
    if strict:
        ctx.strict_only(f"{len(strict)} response(s) differ from the mock's exact shapes "
                        f"(strict.yaml): {_shown(strict)}")


@check("SCHEMA-2", "fuzz", title="schemathesis over every contract operation: no 5xx, "
       "documented status codes, content types, headers and response schemas")
def schema2_fuzz(ctx: Ctx) -> None:
    if ctx.wire.openapi is None:
        raise CheckWarning("no openapi.yaml loaded (--no-schema)")
    if ctx.options.fuzz_examples <= 0:
        raise CheckWarning("fuzz pass disabled (--fuzz-examples 0)")
    session = ctx.session(fresh=True)
    run = ctx.run(session=session)
    run.forward([ce_datum(ctx.tokens("fuzz"))], backward=True)
    run.step()
    real_ids = {"session_id": session.id, "run_id": run.id, "seq": 1}
    if ctx.has_primitive("export_lora"):
        real_ids["export_id"] = run.body("export_lora")["export_id"]
    ctx.wire.call("POST", f"/runs/{run.id}/finish", {})
    sent, problems = fuzz_operations(ctx.wire, ctx.wire.openapi.document,
                                     ctx.options.fuzz_examples, real_ids, ctx.tag())
    if problems:
        raise CheckFailed(f"{len(problems)} of {sent} fuzzed requests failed: "
                          + "; ".join(problems[:4]))
