"""conformance.schema: the shipped contract copy and response validation against it."""

from __future__ import annotations

import orjson
import pytest

from conformance.schema import PACKAGED_OPENAPI, REPO_OPENAPI, OpenAPI

RUN_VIEW = {"run_id": "run_1", "session_id": "sess_1", "state": "active", "next_seq": 1,
            "step": 0, "versions": [], "created_at": "2026-01-01T00:00:00Z"}
JSON = {"content-type": "application/json", "x-request-id": "r1"}


@pytest.fixture(scope="module")
def spec() -> OpenAPI:
    return OpenAPI.load(PACKAGED_OPENAPI)


def test_shipped_copy_equals_the_repository_contract() -> None:
    """The package ships conformance/openapi.yaml; it must be the repository's file byte for
    byte (refresh with: cp openapi.yaml conformance/openapi.yaml)."""
    assert REPO_OPENAPI.exists()
    assert PACKAGED_OPENAPI.read_bytes() == REPO_OPENAPI.read_bytes()


def test_paths_resolve_with_or_without_prefix(spec: OpenAPI) -> None:
    assert spec.match_path("/runs/abc/finish") == "/v1/training/runs/{run_id}/finish"
    assert spec.match_path("/v1/training/runs/abc") == "/v1/training/runs/{run_id}"
    assert spec.match_path("/runs/abc/operations/3") == "/v1/training/runs/{run_id}/operations/{seq}"
    assert spec.match_path("/nowhere") is None


def test_a_conforming_response_has_no_problem(spec: OpenAPI) -> None:
    assert spec.validate_response("GET", "/runs/run_1", 200, JSON, orjson.dumps(RUN_VIEW)) == []


@pytest.mark.parametrize("mutate, expected", [
    (lambda v: v.pop("next_seq"), "next_seq"),
    (lambda v: v.update(step="0"), "step"),
    (lambda v: v.update(state="paused"), "state"),
    (lambda v: v.update(invented=1), "invented"),
])
def test_body_problems_are_reported(spec: OpenAPI, mutate, expected: str) -> None:  # noqa: ANN001
    view = dict(RUN_VIEW)
    mutate(view)
    problems = spec.validate_response("GET", "/runs/run_1", 200, JSON, orjson.dumps(view))
    assert problems and any(expected in p for p in problems), problems


def test_undocumented_status_and_missing_header(spec: OpenAPI) -> None:
    envelope = orjson.dumps({"error": {"type": "forbidden", "message": "m", "details": {}}})
    problems = spec.validate_response("GET", "/runs/run_1", 403, JSON, envelope)
    assert len(problems) == 1 and "403 not documented" in problems[0]
    problems = spec.validate_response("GET", "/runs/run_1", 200,
                                      {"content-type": "application/json"}, orjson.dumps(RUN_VIEW))
    assert any("X-Request-Id" in p for p in problems), problems


def test_error_type_must_be_listed_for_the_status(spec: OpenAPI) -> None:
    listed = orjson.dumps({"error": {"type": "not_found", "message": "m", "details": {}}})
    unlisted = orjson.dumps({"error": {"type": "seq_gap", "message": "m",
                                       "details": {"expected_seq": 1}}})
    assert spec.validate_response("GET", "/runs/run_1", 404, JSON, listed) == []
    problems = spec.validate_response("GET", "/runs/run_1", 404, JSON, unlisted)
    assert any("x-error-types" in p for p in problems), problems


def test_content_types(spec: OpenAPI) -> None:
    problems = spec.validate_response("GET", "/runs/run_1", 200,
                                      {"content-type": "text/plain", "x-request-id": "r"},
                                      orjson.dumps(RUN_VIEW))
    assert any("content type" in p for p in problems), problems
    path = "/runs/run_1/exports/exp_1/adapter_model.safetensors"
    binary = {"content-type": "application/octet-stream", "x-request-id": "r"}
    assert spec.validate_response("GET", path, 200, binary, b"\x00\x01") == []
