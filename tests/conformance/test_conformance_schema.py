"""conformance.schema: the one contract file and response validation against it."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib import resources
from pathlib import Path

import orjson
import pytest

import conformance
from conformance.schema import CONTRACT_RESOURCE, STRICT_RESOURCE, OpenAPI, contract_bytes

REPO = Path(__file__).resolve().parents[2]

RUN_VIEW = {"run_id": "run_1", "session_id": "sess_1", "state": "active", "next_seq": 1,
            "step": 0, "versions": [], "created_at": "2026-01-01T00:00:00Z"}
JSON = {"content-type": "application/json", "x-request-id": "r1"}


@pytest.fixture(scope="module")
def spec() -> OpenAPI:
    return OpenAPI.load()


@pytest.fixture(scope="module")
def strict() -> OpenAPI:
    return OpenAPI.load(profile="strict")


def test_there_is_one_contract_file() -> None:
    """The contract lives once, as package data of ``conformance``; the repository root path
    the product promises is a relative symlink to it, not a second copy."""
    packaged = Path(conformance.__file__).parent / CONTRACT_RESOURCE
    root = REPO / "openapi.yaml"
    assert packaged.is_file() and not packaged.is_symlink()
    assert root.is_symlink() and not os.path.isabs(os.readlink(root))
    assert root.resolve() == packaged.resolve()
    assert contract_bytes() == packaged.read_bytes()
    copies = [p for p in REPO.rglob("openapi*.y*ml")
              if ".git" not in p.parts and not p.is_symlink()]
    assert copies == [packaged], copies


def test_contract_and_overlay_ship_as_package_data() -> None:
    import tomllib

    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    shipped = config["tool"]["setuptools"]["package-data"]["conformance"]
    assert {CONTRACT_RESOURCE, STRICT_RESOURCE} <= set(shipped)
    assert resources.files("conformance").joinpath(STRICT_RESOURCE).is_file()


def test_the_contract_is_read_as_package_data_from_any_folder(tmp_path: Path) -> None:
    """``OpenAPI.load()`` reads the resource through importlib.resources, not a path relative
    to the working folder or the repository."""
    code = ("from conformance.schema import OpenAPI; o = OpenAPI.load(); "
            "print(o.source, len(o.document['paths']))")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                         text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["conformance/openapi.yaml", "(package", "data)",
                                  str(len(OpenAPI.load().document["paths"]))]
    assert resources.files("conformance").joinpath(CONTRACT_RESOURCE).is_file()


def test_paths_resolve_with_or_without_prefix(spec: OpenAPI) -> None:
    assert spec.match_path("/runs/abc/finish") == "/v1/training/runs/{run_id}/finish"
    assert spec.match_path("/v1/training/runs/abc") == "/v1/training/runs/{run_id}"
    assert spec.match_path("/runs/abc/operations/3") == \
        "/v1/training/runs/{run_id}/operations/{seq}"
    assert spec.match_path("/nowhere") is None


def test_a_conforming_response_has_no_problem(spec: OpenAPI) -> None:
    assert spec.validate_response("GET", "/runs/run_1", 200, JSON, orjson.dumps(RUN_VIEW)) == []


@pytest.mark.parametrize("mutate, expected", [
    (lambda v: v.pop("next_seq"), "next_seq"),
    (lambda v: v.update(step="0"), "step"),
    (lambda v: v.update(state="paused"), "state"),
])
def test_body_problems_are_reported(spec: OpenAPI, strict: OpenAPI, mutate,  # noqa: ANN001
                                    expected: str) -> None:
    view = dict(RUN_VIEW)
    mutate(view)
    for profile in (spec, strict):
        problems = profile.validate_response("GET", "/runs/run_1", 200, JSON, orjson.dumps(view))
        assert problems and any(expected in p for p in problems), problems


def test_extra_response_fields_are_strict_only(spec: OpenAPI, strict: OpenAPI) -> None:
    """EXT-1: a run view with a field the contract does not define is legal; the strict
    profile (the mock's exact shapes) reports it."""
    body = orjson.dumps({**RUN_VIEW, "base_model": "whitney-mock/tiny-byte"})
    assert spec.validate_response("GET", "/runs/run_1", 200, JSON, body) == []
    problems = strict.validate_response("GET", "/runs/run_1", 200, JSON, body)
    assert problems and "base_model" in problems[0], problems


def test_profiles_read_one_file() -> None:
    """The strict document is the contract file with the overlay applied, not another file."""
    from conformance.schema import strict_document

    assert OpenAPI.load(profile="strict").document == strict_document(OpenAPI.load().document)
    with pytest.raises(ValueError, match="unknown profile"):
        OpenAPI.load(profile="lenient")


def test_undocumented_status_and_missing_header(spec: OpenAPI) -> None:
    envelope = orjson.dumps({"error": {"type": "forbidden", "message": "m", "details": {}}})
    problems = spec.validate_response("GET", "/runs/run_1", 403, JSON, envelope)
    assert len(problems) == 1 and "403 not documented" in problems[0]
    assert spec.validate_response("GET", "/runs/run_1", 404, JSON, orjson.dumps(
        {"error": {"type": "not_found", "message": "m"}}))  # ERR-1: details is required
    problems = spec.validate_response("GET", "/runs/run_1", 200,
                                      {"content-type": "application/json"}, orjson.dumps(RUN_VIEW))
    assert any("X-Request-Id" in p for p in problems), problems


def test_error_type_is_listed_for_the_status_under_strict_only(spec: OpenAPI,
                                                                strict: OpenAPI) -> None:
    """EXT-1: the contract names no type for "no such run", so any type is legal there; the
    strict profile wants the mock's ``not_found``."""
    listed = orjson.dumps({"error": {"type": "not_found", "message": "m", "details": {}}})
    unlisted = orjson.dumps({"error": {"type": "run_not_found", "message": "m", "details": {}}})
    assert spec.validate_response("GET", "/runs/run_1", 404, JSON, listed) == []
    assert spec.validate_response("GET", "/runs/run_1", 404, JSON, unlisted) == []
    assert strict.validate_response("GET", "/runs/run_1", 404, JSON, listed) == []
    problems = strict.validate_response("GET", "/runs/run_1", 404, JSON, unlisted)
    assert any("x-error-types" in p for p in problems), problems


def test_content_types(spec: OpenAPI) -> None:
    problems = spec.validate_response("GET", "/runs/run_1", 200,
                                      {"content-type": "text/plain", "x-request-id": "r"},
                                      orjson.dumps(RUN_VIEW))
    assert any("content type" in p for p in problems), problems
    path = "/runs/run_1/exports/exp_1/adapter_model.safetensors"
    binary = {"content-type": "application/octet-stream", "x-request-id": "r"}
    assert spec.validate_response("GET", path, 200, binary, b"\x00\x01") == []


def test_header_values_are_validated(spec: OpenAPI, strict: OpenAPI) -> None:
    """Documented headers are checked by value, not only by presence: ``Retry-After`` is whole
    seconds; ``Whitney-Replayed: false`` is legal (EXT-1) but never sent by the mock."""
    step = orjson.dumps({"step": 1, "grad_norm": 0.5, "update_norm": 0.01})
    false = {**JSON, "whitney-replayed": "false"}
    assert spec.validate_response("POST", "/runs/r/optim_step", 200, false, step) == []
    problems = strict.validate_response("POST", "/runs/r/optim_step", 200, false, step)
    assert len(problems) == 1 and "Whitney-Replayed" in problems[0], problems
    throttled = orjson.dumps({"error": {"type": "rate_limited", "message": "m", "details": {}}})
    for value, ok in (("2", True), ("soon", False), ("-1", False)):
        headers = {**JSON, "retry-after": value}
        problems = spec.validate_response("POST", "/runs/r/optim_step", 429, headers, throttled)
        assert (problems == []) is ok, (value, problems)


def test_a_fuzz_pass_leaves_the_loaded_contract_as_written(monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    """SCHEMA-2 tags the sessions it creates; a generated case may carry the document's own
    example object as its body, so schemathesis works on a copy and the loaded contract (shared
    by every later validation) stays as written."""
    import schemathesis
    import yaml

    from conformance import open_target, run_suite
    from conformance.options import Options

    given: list[object] = []
    real_from_dict = schemathesis.openapi.from_dict

    def spy(document: dict, *args: object, **kwargs: object) -> object:  # type: ignore[type-arg]
        given.append(document)
        return real_from_dict(document, *args, **kwargs)

    monkeypatch.setattr(schemathesis.openapi, "from_dict", spy)
    target = open_target(use_env=False)
    try:
        summary = run_suite(target, only=["SCHEMA-2"], options=Options(fuzz_examples=2))
    finally:
        target.close()
    assert summary.exit_code == 0 and len(given) == 1
    loaded = OpenAPI.load().document
    assert given[0] is not loaded and given[0] is not loaded["paths"]
    assert loaded == yaml.safe_load(contract_bytes())
