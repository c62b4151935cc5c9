"""Row 2: parsing and validating a large ``forward_backward`` body against ``orjson.loads``.

The measured path is the mock's own, step by step as ``responses.primitive_endpoint`` runs it:
``schemas.parse_json`` -> ``schemas.validate(schemas.Forward, ...)`` ->
``schemas.canonical_digest`` (ORD-3 replay digest) -> ``primitives.prepare_forward`` (limits,
vocabulary and loss-input checks, conversion to numpy). Each step is also shown on its own
against the same floor, so the expensive one is visible.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson

from mock_server import Backend
from mock_server.backend import schemas
from mock_server.engine.specs import BASE_MODEL_ID
from mock_server.backend.primitives import prepare_forward

from .core import Config, Row, interleave, make_row
from .fixtures import API_KEY, forward_body

GOAL = 2.0


def backend_run(rank: int = 8) -> tuple[Backend, Any]:
    """A Backend with one run, created without HTTP."""
    backend = Backend(api_keys=(API_KEY,))
    session = backend.create_session(key=API_KEY, body=schemas.CreateSession())
    view = backend.create_run(key=API_KEY, session_id=session["session_id"],
                              body=schemas.CreateRun(base_model=BASE_MODEL_ID,
                                                     lora=schemas.LoraConfig(rank=rank,
                                                                             alpha=2.0 * rank),
                                                     optimizer="adamw"))
    return backend, backend.runs[view["run_id"]]


def body_bytes(cfg: Config) -> bytes:
    return orjson.dumps(forward_body(np.random.default_rng(2), cfg.body_datums, cfg.body_tokens))


async def rows(cfg: Config) -> list[Row]:
    raw = body_bytes(cfg)
    backend, run = backend_run(cfg.lora_rank)
    payload = schemas.parse_json(raw)
    body = schemas.validate(schemas.Forward, payload)

    def full_path() -> None:
        parsed = schemas.parse_json(raw)
        validated = schemas.validate(schemas.Forward, parsed)
        schemas.canonical_digest(parsed)
        prepare_forward(backend, run, validated, backward=True)

    timings = await interleave({
        "floor": lambda: orjson.loads(raw),
        "total": full_path,
        "parse": lambda: schemas.parse_json(raw),
        "validate": lambda: schemas.validate(schemas.Forward, payload),
        "digest": lambda: schemas.canonical_digest(payload),
        "prepare": lambda: prepare_forward(backend, run, body, backward=True),
    }, cfg)
    floor = timings["floor"].median_s
    size = f"{cfg.body_datums} x {cfg.body_tokens} tok, {len(raw) / 1e6:.1f} MB"
    group = "2 body handling"
    return [
        make_row(group, f"forward_backward body, whole path ({size})", timings["total"].median_s,
                 floor, "s", GOAL, "parse_json + validate + canonical_digest + prepare_forward "
                 "vs orjson.loads of the same bytes"),
        make_row(group, "  step: schemas.parse_json", timings["parse"].median_s, floor, "s",
                 None, "orjson + the empty-body check"),
        make_row(group, "  step: schemas.validate(Forward)", timings["validate"].median_s, floor,
                 "s", None, "strict pydantic v2, per-element list[int] / list[float]"),
        make_row(group, "  step: schemas.canonical_digest", timings["digest"].median_s, floor,
                 "s", None, "orjson OPT_SORT_KEYS + sha256 (ORD-3)"),
        make_row(group, "  step: primitives.prepare_forward", timings["prepare"].median_s, floor,
                 "s", None, "limits, vocabulary and loss-input checks, lists -> numpy"),
    ]
