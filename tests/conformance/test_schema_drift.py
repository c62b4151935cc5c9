"""The server's pydantic request models and ``openapi.yaml`` must not drift.

Both are reduced to one canonical tree (type, nullability, properties, required set, closed or
not, numeric and length bounds, items) and compared operation by operation, so a field added,
dropped, made optional or given another range on one side alone fails here.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from conformance.schema import contract_bytes
from mock_server.backend import schemas
from mock_server.backend.primitives import PRIMITIVES

SPEC = yaml.safe_load(contract_bytes())

OPERATION_MODELS: dict[str, type] = {
    "create_session": schemas.CreateSession,
    "heartbeat_session": schemas.Empty,
    "close_session": schemas.Empty,
    "finish_run": schemas.Empty,
    "cancel_run": schemas.Empty,
    "create_run": schemas.CreateRun,
    **{name: primitive.body for name, primitive in PRIMITIVES.items()},
}

BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minLength", "maxLength",
          "minItems", "maxItems")


def _resolve(node: Any, root: dict[str, Any]) -> Any:
    while isinstance(node, dict) and "$ref" in node:
        path = node["$ref"].lstrip("#/").split("/")
        target: Any = root
        for part in path:
            target = target[part]
        node = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
    return node


def canonical(node: Any, root: dict[str, Any]) -> Any:
    """Reduce a JSON schema (OpenAPI 3.1 or pydantic's) to what both must agree on."""
    node = _resolve(node, root)
    nullable = False
    variants = node.get("anyOf") or node.get("oneOf")
    if variants:
        kept = [v for v in variants if _resolve(v, root).get("type") != "null"]
        nullable = len(kept) < len(variants)
        assert len(kept) == 1, f"unexpected union {variants}"
        node = {**_resolve(kept[0], root), **{k: v for k, v in node.items()
                                              if k not in ("anyOf", "oneOf")}}
    kind = node.get("type")
    if isinstance(kind, list):
        nullable = nullable or "null" in kind
        kinds = [k for k in kind if k != "null"]
        assert len(kinds) == 1, kind
        kind = kinds[0]
    if "const" in node:
        node = {**node, "enum": [node["const"]]}
    tree: dict[str, Any] = {"type": kind, "nullable": nullable}
    tree.update({b: node[b] for b in BOUNDS if b in node})
    if "enum" in node:
        tree["enum"] = sorted(node["enum"])
    if kind == "object":
        props = node.get("properties", {})
        tree["properties"] = {k: canonical(v, root) for k, v in props.items()}
        tree["required"] = sorted(node.get("required", []))
        extra = node.get("additionalProperties", True)
        tree["additional"] = extra if isinstance(extra, bool) else canonical(extra, root)
    if kind == "array":
        tree["items"] = canonical(node["items"], root)
    return tree


def _openapi_request(operation_id: str) -> dict[str, Any]:
    for item in SPEC["paths"].values():
        for op in item.values():
            if isinstance(op, dict) and op.get("operationId") == operation_id:
                schema = op["requestBody"]["content"]["application/json"]["schema"]
                return canonical(schema, SPEC)
    raise KeyError(operation_id)


def _pydantic_request(model: type) -> dict[str, Any]:
    schema = model.model_json_schema(ref_template="#/$defs/{model}")  # type: ignore[attr-defined]
    return canonical(schema, schema)


def _diff(a: Any, b: Any, path: str = "body") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for key in sorted(set(a) | set(b)):
            if key not in a or key not in b:
                out.append(f"{path}.{key}: only in {'pydantic' if key in a else 'openapi'}")
            else:
                out += _diff(a[key], b[key], f"{path}.{key}")
        return out
    return [] if a == b else [f"{path}: pydantic {a!r} != openapi {b!r}"]


@pytest.mark.parametrize("operation_id", sorted(OPERATION_MODELS))
def test_request_model_matches_openapi(operation_id: str) -> None:
    differences = _diff(_pydantic_request(OPERATION_MODELS[operation_id]),
                        _openapi_request(operation_id))
    assert differences == []


def test_every_contract_request_body_has_a_model() -> None:
    with_bodies = {op["operationId"] for item in SPEC["paths"].values() for op in item.values()
                   if isinstance(op, dict) and "requestBody" in op
                   and "mock-control-plane" not in op.get("tags", [])}
    assert with_bodies == set(OPERATION_MODELS)


def test_the_comparison_catches_a_drift() -> None:
    """The canonical form is not vacuous: a changed bound or an extra field shows up."""
    from pydantic import Field, create_model

    tampered = create_model("Tampered", __base__=schemas.SaveWeightsForSampler,
                            version=(int, Field(ge=1)))
    assert _diff(_pydantic_request(tampered), _openapi_request("save_weights_for_sampler"))
    extra = create_model("Extra", __base__=schemas.ExportLora, note=(str, ""))
    assert _diff(_pydantic_request(extra), _openapi_request("export_lora"))
