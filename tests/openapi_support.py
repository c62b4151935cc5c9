"""Shared ground of ``test_openapi_spec.py`` and ``test_openapi_ranges.py``: where the YAML and
the prose contract (``whitney-contract.md``) are, the module-scoped fixtures that load them (the
contract as written, and as the ``strict`` profile reads it: ``strict.yaml`` applied over it),
and walks over the document (operations, responses, ``$ref``s, 2020-12 validators at a pointer).

Test modules import the fixtures by name (``from openapi_support import spec, ...``) so pytest
finds them there; this module is not collected (no ``test_`` prefix).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import yaml
from jsonschema import Draft202012Validator
from referencing import Registry
from referencing.jsonschema import DRAFT202012

from conformance.schema import contract_bytes, strict_document

ROOT = Path(__file__).resolve().parents[1]
CONTRACT_CANDIDATES = [
    Path(os.environ["WHITNEY_CONTRACT"]) if os.environ.get("WHITNEY_CONTRACT") else None,
    ROOT / "docs" / "whitney-contract.md",
    Path("/work/shared/whitney-contract.md"),
]
BASE_URI = "urn:whitney:openapi"
PRIMITIVES = ["forward", "forward_backward", "optim_step", "save_weights_for_sampler", "sample",
              "logprobs", "save_state", "load_state", "export_lora"]
METHODS = {"get", "post", "put", "patch", "delete", "head", "options", "trace"}
Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


# ----------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def spec_text() -> str:
    return contract_bytes().decode("utf-8")


@pytest.fixture(scope="module")
def spec(spec_text: str) -> dict[str, Any]:
    return yaml.load(spec_text, Loader=Loader)


@pytest.fixture(scope="module")
def strict_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """The document the strict profile validates against (the mock's exact shapes)."""
    return strict_document(spec)


@pytest.fixture(scope="module")
def strict_registry(strict_spec: dict[str, Any]) -> Registry:
    return Registry().with_resource(BASE_URI, DRAFT202012.create_resource(strict_spec))


@pytest.fixture(scope="module")
def contract() -> str:
    for path in CONTRACT_CANDIDATES:
        if path is not None and path.is_file():
            return path.read_text(encoding="utf-8")
    pytest.skip("whitney-contract.md not found (set WHITNEY_CONTRACT)")


@pytest.fixture(scope="module")
def registry(spec: dict[str, Any]) -> Registry:
    return Registry().with_resource(BASE_URI, DRAFT202012.create_resource(spec))


def pointer(*parts: Any) -> str:
    return "/" + "/".join(str(p).replace("~", "~0").replace("/", "~1") for p in parts)


def validator_at(registry: Registry, json_pointer: str) -> Draft202012Validator:
    """A 2020-12 validator for the schema at ``json_pointer`` inside the spec (refs resolved)."""
    ref = {"$ref": f"{BASE_URI}#{quote(json_pointer, safe='/~')}"}
    return Draft202012Validator(ref, registry=registry,
                                format_checker=Draft202012Validator.FORMAT_CHECKER)


def resolve(spec: dict[str, Any], node: Any) -> Any:
    while isinstance(node, dict) and "$ref" in node:
        assert node["$ref"].startswith("#/"), node["$ref"]
        target: Any = spec
        for part in node["$ref"][2:].split("/"):
            target = target[part.replace("~1", "/").replace("~0", "~")]
        node = target
    return node


def operations(spec: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, item in spec["paths"].items():
        for method, op in item.items():
            if method in METHODS:
                yield path, method, op


def responses(spec: dict[str, Any]) -> Iterator[tuple[str, str, str, dict[str, Any]]]:
    for path, method, op in operations(spec):
        for status, response in op["responses"].items():
            yield path, method, status, resolve(spec, response)
