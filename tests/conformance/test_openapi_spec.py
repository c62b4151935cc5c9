"""Static checks of ``openapi.yaml`` against the prose contract (``whitney-contract.md``): the
document itself, its responses, its request bodies, its examples and DISC-1's capabilities.

The references are independent of the YAML: the contract text (rule ids, error names, the
DISC-1 field lists) and JSON Schema 2020-12 semantics (``jsonschema``) applied to the document's
examples and hand-built bodies. No server is involved. The section 4a ranges and the shapes of
single schemas are in ``test_openapi_ranges.py``; the shared fixtures in ``openapi_support.py``.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from typing import Any

from jsonschema import Draft202012Validator
from openapi_spec_validator import validate as validate_openapi
from openapi_support import (  # noqa: F401
    PRIMITIVES,
    contract,
    operations,
    pointer,
    registry,
    resolve,
    responses,
    spec,
    spec_text,
    strict_registry,
    strict_spec,
    validator_at,
)
from referencing import Registry

# The error names the prose contract never gives, which the mock uses (the strict profile's).
MOCK_ERROR_TYPES = {"validation_error", "unauthorized", "not_found", "operation_not_found",
                    "export_not_found", "rate_limited", "internal_error", "non_finite_loss",
                    "non_finite_update", "checkpoint_incompatible", "method_not_allowed"}


# ----------------------------------------------------------------------------------- the document
def test_spec_is_valid_openapi_3_1(spec: dict[str, Any]) -> None:
    validate_openapi(spec)
    assert spec["openapi"] == "3.1.0"
    assert spec["servers"] == [{"url": "/"}]


def test_info_version_matches_contract_version(spec: dict[str, Any]) -> None:
    """DISC-1: the document is contract 1.1; ``contract_version`` is "1.1", or "1.0" for a
    server of the previous version (held to 1.0's rules, declaring no 1.1 feature)."""
    assert spec["info"]["version"] == spec["info"]["x-contract-version"] == "1.1"
    caps = spec["components"]["schemas"]["Capabilities"]["properties"]["contract_version"]
    assert caps["enum"] == ["1.0", spec["info"]["version"]]


def test_every_contract_rule_id_appears_in_the_spec(spec_text: str, contract: str) -> None:
    rule_ids = set(re.findall(r"[A-Z]+-\d+", contract))
    assert len(rule_ids) >= 40  # the contract has ~40 rules; guards against a bad regex
    missing = sorted(r for r in rule_ids if not re.search(rf"\b{re.escape(r)}\b", spec_text))
    assert missing == []


def test_contract_paths_are_all_present(spec: dict[str, Any]) -> None:
    expected = {
        "/v1/training/capabilities", "/v1/training/sessions",
        "/v1/training/sessions/{session_id}", "/v1/training/sessions/{session_id}/heartbeat",
        "/v1/training/sessions/{session_id}/close", "/v1/training/sessions/{session_id}/runs",
        "/v1/training/runs/{run_id}", "/v1/training/runs/{run_id}/finish",
        "/v1/training/runs/{run_id}/cancel", "/v1/training/runs/{run_id}/operations/{seq}",
        "/v1/training/runs/{run_id}/exports/{export_id}/{name}",
        "/_mock/trace", "/_mock/faults", "/_mock/reset",
    } | {f"/v1/training/runs/{{run_id}}/{p}" for p in PRIMITIVES}
    assert set(spec["paths"]) == expected


def test_operation_ids_are_unique_snake_case(spec: dict[str, Any]) -> None:
    ids = [op["operationId"] for _, _, op in operations(spec)]
    assert len(ids) == len(set(ids))
    assert all(re.fullmatch(r"[a-z][a-z0-9]*(_[a-z0-9]+)*", i) for i in ids), ids
    for primitive in PRIMITIVES:
        assert spec["paths"][f"/v1/training/runs/{{run_id}}/{primitive}"]["post"][
            "operationId"] == primitive


def test_bearer_auth_on_every_operation(spec: dict[str, Any]) -> None:
    """SEC-1: every operation (the mock plane too) needs the bearer key and documents 401."""
    scheme = spec["components"]["securitySchemes"]["bearerAuth"]
    assert scheme == {**scheme, "type": "http", "scheme": "bearer"}
    for path, method, op in operations(spec):
        assert op.get("security", spec["security"]) == [{"bearerAuth": []}], (path, method)
        assert "401" in op["responses"], (path, method)
        if path.startswith("/_mock/"):
            assert op["tags"] == ["mock-control-plane"], (path, method)
        else:
            assert path.startswith("/v1/training/"), path


# ----------------------------------------------------------------------------------- responses
def test_every_response_carries_x_request_id(spec: dict[str, Any]) -> None:
    """TRANSPORT-1."""
    for path, method, status, response in responses(spec):
        header = resolve(spec, response.get("headers", {}).get("X-Request-Id"))
        assert header and header["required"] is True, (path, method, status)


def test_primitive_success_responses_declare_whitney_replayed(
        spec: dict[str, Any], strict_spec: dict[str, Any]) -> None:
    """ORD-3: a replay carries ``Whitney-Replayed: true``; recorded failures can be replayed.
    EXT-1: any other value (or none) is not a replay, so the contract allows any string; the
    strict profile (the mock) allows only ``true``."""
    for primitive in PRIMITIVES:
        op = spec["paths"][f"/v1/training/runs/{{run_id}}/{primitive}"]["post"]
        headers = resolve(spec, op["responses"]["200"])["headers"]
        header = resolve(spec, headers["Whitney-Replayed"])
        assert header["schema"] == {"type": "string"}
        assert header["required"] is False
    strict_header = strict_spec["components"]["headers"]["Whitney-Replayed"]
    assert strict_header["schema"] == {"type": "string", "enum": ["true"]}
    recorded_failures = {"no_gradients", "version_conflict", "quota_exceeded",
                         "version_not_found", "checkpoint_not_found"}
    for path, _, status, response in responses(spec):
        primitive_path = path.rsplit("/", 1)[-1] in PRIMITIVES
        if primitive_path and recorded_failures & set(response.get("x-error-types", [])):
            assert "Whitney-Replayed" in response["headers"], (path, status)


def test_error_responses_use_the_one_error_envelope(spec: dict[str, Any],
                                                    strict_spec: dict[str, Any]) -> None:
    """ERR-1: every 4xx/5xx references ``Error``; under the strict profile each also names the
    ``error.type`` values the mock answers with."""
    for path, _method, status, response in responses(spec):
        if status[0] not in "45":
            continue
        media = response["content"]["application/json"]
        assert media["schema"] == {"$ref": "#/components/schemas/Error"}, (path, status)
        if status == "429":
            assert resolve(spec, response["headers"]["Retry-After"])["required"] is True
    for path, _method, status, response in responses(strict_spec):
        if status[0] in "45":
            types = response.get("x-error-types")
            assert types and all(re.fullmatch(r"[a-z][a-z0-9_]*", t) for t in types), (path,
                                                                                        status)


def test_contract_statuses_are_documented_per_path(spec: dict[str, Any]) -> None:
    """ERR-2: bodies can be malformed (400), too large (413) or invalid (422); all may be
    throttled (429) or fault (5xx); resources by id may be unknown (404)."""
    for path, method, op in operations(spec):
        if path.startswith("/_mock/"):
            continue
        codes = set(op["responses"])
        assert {"401", "429", "5XX"} <= codes, (path, method)
        if method == "post":
            assert {"400", "413", "422"} <= codes, (path, method)
        if "{" in path:
            assert "404" in codes, (path, method)
    cancel = spec["paths"]["/v1/training/runs/{run_id}/cancel"]["post"]["responses"]
    assert {"200", "202"} <= set(cancel)  # LIFE-7 active -> 202, LIFE-8 terminal -> 200
    for path in ("/v1/training/sessions", "/v1/training/sessions/{session_id}/runs"):
        assert "201" in spec["paths"][path]["post"]["responses"]


def contract_error_pairs(contract: str) -> set[tuple[str, str]]:
    """The ``(status, error.type)`` pairs the prose contract spells out."""
    pairs = set(re.findall(r"\b(4\d\d)\s+`([a-z_]+)`", contract))
    pairs |= {("409", n) for n in re.findall(r"`run_not_active`/`(\w+)`/`(\w+)`", contract)[0]}
    return pairs | {("422", "limit_exceeded")}


def test_error_names_of_the_contract_are_documented_with_their_status(
        spec: dict[str, Any], strict_spec: dict[str, Any], contract: str) -> None:
    """Every ``<status> `name``` pair the contract spells out is in that status's x-error-types;
    the contract file names no other type (EXT-1), the mock's own come from the overlay."""
    pairs = contract_error_pairs(contract)
    assert len(pairs) >= 16
    documented = {(status, t) for _, _, status, r in responses(spec)
                  for t in r.get("x-error-types", [])}
    assert sorted(pairs - documented) == []
    named = {t for _, t in pairs} | {"run_cancelled", "seq_conflict", "runs_not_terminal",
                                     "session_not_open", "unexpected_input"}
    in_contract = {t for path, _, _, r in responses(spec) if path.startswith("/v1/")
                   for t in r.get("x-error-types", [])}
    assert in_contract <= named, sorted(in_contract - named)
    strict = {(status, t) for path, _, status, r in responses(strict_spec)
              if path.startswith("/v1/") for t in r.get("x-error-types", [])}
    assert {("401", "unauthorized"), ("429", "rate_limited"), ("404", "not_found"),
            ("422", "validation_error")} <= strict
    assert {t for _, t in strict} == in_contract | MOCK_ERROR_TYPES


def response_objects(document: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(where, schema) for every object schema with ``properties`` in a /v1/training response
    (conditional sub-checks under if/then/else/not are not shapes)."""
    schemas = document["components"]["schemas"]
    seen: set[str] = set()
    found: list[tuple[str, dict[str, Any]]] = []

    def walk(node: Any, where: str) -> None:
        if isinstance(node, dict):
            if "$ref" in node:
                name = node["$ref"].rsplit("/", 1)[-1]
                if name not in seen:
                    seen.add(name)
                    walk(schemas[name], name)
                return
            if node.get("type") == "object" and "properties" in node:
                found.append((where, node))
            for key, value in node.items():
                if key not in ("if", "then", "else", "not"):
                    walk(value, f"{where}.{key}")
        elif isinstance(node, list):
            for i, value in enumerate(node):
                walk(value, f"{where}[{i}]")

    for path, method, status, response in responses(document):
        if path.startswith("/v1/training/"):  # the mock plane is not the contract
            for media in response.get("content", {}).values():
                walk(media["schema"], f"{method} {path} {status}")
    assert {"Session", "Run", "Capabilities", "OperationRecord", "ForwardResult",
            "SampleResult", "LogprobsResult", "ExportLoraResult", "Error"} <= seen
    return iter(found)


# Extension points open under both profiles: more metrics, PEFT's other config keys.
OPEN_IN_BOTH = {"ForwardMetrics", "AdapterConfig"}


def test_response_objects_are_open_in_the_contract(spec: dict[str, Any]) -> None:
    """EXT-1: a server may add fields to any response object, so the contract closes none."""
    objects = list(response_objects(spec))
    assert len(objects) >= 30
    closed = [where for where, node in objects if node.get("additionalProperties") is False]
    assert closed == []


def test_response_objects_are_closed_under_the_strict_profile(strict_spec: dict[str, Any]
                                                              ) -> None:
    """The mock invents no response field: under strict, every response object is closed but
    the declared extension points (``metrics``, PEFT's ``adapter_config.json``)."""
    for where, node in response_objects(strict_spec):
        if where.split(".")[0] in OPEN_IN_BOTH:
            assert node.get("additionalProperties") is not False, where
        else:
            assert node.get("additionalProperties") is False, where


# ----------------------------------------------------------------------------------- requests
def request_schemas(spec: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    for path, method, op in operations(spec):
        if "requestBody" in op:
            yield f"{method} {path}", op["requestBody"]["content"]["application/json"]["schema"]


def test_every_request_schema_forbids_unknown_fields(spec: dict[str, Any]) -> None:
    """ERR-4: every object in every request body is closed (maps: values typed). The one
    exception, marked ``x-free-form``, is the mock plane's injected error ``details``."""
    checked: list[str] = []

    def walk(node: Any, where: str) -> None:
        node = resolve(spec, node)
        if isinstance(node, dict):
            types = node.get("type")
            if node.get("x-free-form"):
                assert where.startswith("post /_mock/"), where
            elif types == "object" or (isinstance(types, list) and "object" in types):
                extra = node.get("additionalProperties")
                if "properties" in node or extra is None:
                    assert extra is False, where
                else:
                    assert isinstance(extra, dict) and extra.get("type"), where
                checked.append(where)
            for key, value in node.items():
                if key in ("properties",):
                    for name, sub in value.items():
                        walk(sub, f"{where}.{name}")
                elif key in ("items", "additionalProperties", "allOf", "anyOf", "oneOf",
                             "prefixItems"):
                    walk(value, f"{where}.{key}")
        elif isinstance(node, list):
            for i, value in enumerate(node):
                walk(value, f"{where}[{i}]")

    bodies = list(request_schemas(spec))
    assert len(bodies) == 9 + 8  # primitives; sessions, heartbeat, close, runs, finish, cancel,
    for where, schema in bodies:  # _mock/faults, _mock/reset
        walk(schema, where)
    nested = {w.split(" ", 1)[1].split("}/", 1)[-1] for w in checked}
    assert {"optim_step.adamw", "sample.sampling", "sample.prompt",
            "forward_backward.data.items.model_input", "forward_backward.data.items.loss_inputs",
            "forward_backward.loss_config", "runs.lora"} <= nested, sorted(nested)


def media_examples(spec: dict[str, Any]) -> Iterator[tuple[str, str, Any]]:
    """(label, json pointer of the schema, example value) for every example in the document."""
    for path, method, op in operations(spec):
        places = []
        if "requestBody" in op:
            places.append((("paths", path, method, "requestBody"), op["requestBody"]))
        for status, response in op["responses"].items():
            if "$ref" in response:
                name = response["$ref"].rsplit("/", 1)[-1]
                places.append((("components", "responses", name), resolve(spec, response)))
            else:
                places.append((("paths", path, method, "responses", status), response))
        for base, holder in places:
            for mime, media in holder.get("content", {}).items():
                schema_ptr = pointer(*base, "content", mime, "schema")
                if "example" in media:
                    yield f"{method} {path} {base[-1]}", schema_ptr, media["example"]
                for name, example in media.get("examples", {}).items():
                    yield f"{method} {path} {base[-1]} {name}", schema_ptr, example["value"]


def test_every_example_validates_against_its_schema(spec: dict[str, Any],
                                                    registry: Registry) -> None:
    examples = list(media_examples(spec))
    assert len(examples) >= 40
    failures = []
    cache: dict[str, Draft202012Validator] = {}
    for label, schema_ptr, value in examples:
        validator = cache.setdefault(schema_ptr, validator_at(registry, schema_ptr))
        failures += [f"{label}: {e.message}" for e in validator.iter_errors(value)]
    assert failures == []
    labelled = {label.split()[1] + " " + label.split()[2] for label, _, _ in examples}
    for primitive in PRIMITIVES:  # a worked request and response per primitive
        path = f"/v1/training/runs/{{run_id}}/{primitive}"
        assert {f"{path} requestBody", f"{path} 200"} <= labelled, primitive


# ----------------------------------------------------------------------------------- DISC-1
def backticked(line: str) -> list[str]:
    return re.findall(r"`([a-z_]+)`", line)


def test_capabilities_schema_lists_exactly_the_disc_1_fields(
        spec: dict[str, Any], strict_spec: dict[str, Any], contract: str) -> None:
    disc = contract[contract.index("DISC-1"):contract.index("DISC-2")]
    limits = backticked(disc[disc.index("`limits`"):disc.index("`features`")])[1:]
    features = backticked(disc[disc.index("`features`"):])[1:]
    base = backticked(disc[disc.index("`base_models`"):disc.index("`limits`")])[1:]
    top = ["contract_version", "primitives", "optimizers", "loss_functions", "base_models",
           "limits", "features"]
    schemas = spec["components"]["schemas"]
    assert len(limits) == 11 and len(features) == 3 and len(base) == 5
    optional = {"BaseModel": ["bos_token_id"]}  # added under EXT-1 (contract-changes 3.4b)
    # contract 1.1's optional features (section 7 of the prose contract): never required
    optional["Features"] = re.findall(r"\(optional: (\w+)\)", contract[contract.index("## 7."):])
    assert sorted(optional["Features"]) == ["exports_after_close", "idempotent_create",
                                            "seq_error_details", "session_listing"]
    for name, fields in [("Limits", limits), ("Features", features), ("BaseModel", base),
                         ("Capabilities", top)]:
        assert sorted(schemas[name]["required"]) == sorted(fields), name
        assert sorted(schemas[name]["properties"]) == sorted(fields + optional.get(name, [])), \
            name
        assert "additionalProperties" not in schemas[name], name  # EXT-1
        assert strict_spec["components"]["schemas"][name]["additionalProperties"] is False
    assert schemas["PrimitiveName"]["enum"] == PRIMITIVES


def test_capabilities_loss_declarations_follow_loss_1_to_5(
        spec: dict[str, Any], registry: Registry, strict_registry: Registry) -> None:
    """LOSS-1..5 inputs and config defaults are checked, in any order; bounds are the server's.
    Additions (another loss, config key or feature) are legal (EXT-1) but not the mock's."""
    path = "/v1/training/capabilities"
    where = pointer("paths", path, "get", "responses", "200", "content", "application/json",
                    "schema")
    validator = validator_at(registry, where)
    strict = validator_at(strict_registry, where)
    doc = spec["paths"][path]["get"]["responses"]["200"]["content"]["application/json"][
        "examples"]["mock"]["value"]
    assert validator.is_valid(doc)
    swapped = copy.deepcopy(doc)
    swapped["loss_functions"]["ppo"]["inputs"]["required"].reverse()
    assert validator.is_valid(swapped)
    subset = copy.deepcopy(doc)
    del subset["loss_functions"]["dro"]  # a server may declare a subset (DISC-2 protects)
    assert validator.is_valid(subset) and strict.is_valid(subset)
    for mutate in (
        lambda d: d["loss_functions"]["cross_entropy"]["inputs"]["optional"].clear(),
        lambda d: d["loss_functions"]["cispo"]["config"]["clip_low_threshold"].update(
            default=0.7),
        lambda d: d["limits"].pop("order_wait_ms"),
        lambda d: d["loss_functions"].update(grpo={"inputs": {"required": []}, "config": {}}),
    ):
        bad = copy.deepcopy(doc)
        mutate(bad)
        assert not validator.is_valid(bad) and not strict.is_valid(bad)
    for mutate in (
        lambda d: d["loss_functions"]["dro"]["config"].update(gamma=d["loss_functions"]["dro"][
            "config"]["beta"]),
        lambda d: d["loss_functions"]["cross_entropy"]["config"].update(
            label_smoothing={"default": 0.0, "min": 0.0, "max": 1.0}),
        lambda d: d["loss_functions"].update(grpo=d["loss_functions"]["ppo"]),
        lambda d: d["features"].update(streaming=True),
        lambda d: d.update(server_version="2.3.1"),
        lambda d: d["base_models"][0].update(family="tiny"),
    ):
        extended = copy.deepcopy(doc)
        mutate(extended)
        assert validator.is_valid(extended) and not strict.is_valid(extended)
