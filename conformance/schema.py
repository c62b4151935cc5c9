"""Validate every response the suite receives against ``openapi.yaml``.

Where the contract file comes from: there is one copy, ``conformance/openapi.yaml``, package
data read through :mod:`importlib.resources` wherever the package is installed. The
repository's ``openapi.yaml`` (the path the product promises) is a relative symlink to it
(``tests/conformance/test_conformance_schema.py`` checks both). ``--openapi PATH`` points the
suite at another file (for example a newer contract under review).

Profiles (:data:`PROFILES`): ``contract`` validates against the file as it is: response objects
open to extra fields, ``error.type`` free except where a rule names it (EXT-1). ``strict``
validates against the same file with ``strict.yaml`` applied over it (:func:`strict_document`):
closed response objects, the mock's error vocabulary per response, its ``details`` keys,
``Whitney-Replayed`` only ever ``true``. The overlay is the only place those shapes live.

Validation of one response (:meth:`OpenAPI.validate_response`): the operation must be
documented for the method and path; the status must be documented (exact code, then ``4XX``
style ranges, then ``default``); documented required headers must be present; a JSON body must
be declared with a JSON media type and match the schema (JSON Schema 2020-12, local ``$ref``
resolved through a ``referencing`` registry that holds the whole document); under ``strict``,
``error.type`` must also be among the response's ``x-error-types``.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import quote

import jsonschema
import orjson
import referencing
import yaml
from referencing.jsonschema import DRAFT202012

from .options import PROFILES

__all__ = ["OpenAPI", "CONTRACT_RESOURCE", "STRICT_RESOURCE", "PROFILES", "contract_bytes",
           "strict_overlay", "strict_document"]

CONTRACT_RESOURCE = "openapi.yaml"  # package data of ``conformance``: the one copy
STRICT_RESOURCE = "strict.yaml"  # the strict profile's overlay on it
_PACKAGED_SOURCE = f"{__package__}/{CONTRACT_RESOURCE} (package data)"
_DOC_URI = "urn:whitney-openapi"
_API_PREFIX = "/v1/training"
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def contract_bytes() -> bytes:
    """The contract file as shipped in the package."""
    return resources.files(__package__).joinpath(CONTRACT_RESOURCE).read_bytes()


def strict_overlay() -> dict[str, Any]:
    """``strict.yaml``, the strict profile's overlay (package data)."""
    data = resources.files(__package__).joinpath(STRICT_RESOURCE).read_bytes()
    overlay: dict[str, Any] = yaml.load(data, Loader=_Loader)
    return overlay


def _escape(segment: str) -> str:
    return segment.replace("~", "~0").replace("/", "~1")


def _split(pointer: str) -> list[str]:
    if not pointer.startswith("/"):
        raise ValueError(f"not a JSON pointer: {pointer!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in pointer[1:].split("/")]


def _at(document: Any, pointer: str) -> Any:
    node = document
    for part in _split(pointer):
        try:
            node = node[int(part)] if isinstance(node, list) else node[part]
        except (KeyError, IndexError, ValueError):
            raise ValueError(f"strict overlay: {pointer} is not in the document") from None
    return node


def _close_objects(node: Any, schemas: dict[str, Any], seen: set[str]) -> None:
    """``additionalProperties: false`` on every ``type: object`` schema under ``node`` that
    declares ``properties`` and leaves ``additionalProperties`` unsaid. Conditions
    (if/then/else/not) and partial refinements without a ``type`` are not shapes."""
    if isinstance(node, list):
        for item in node:
            _close_objects(item, schemas, seen)
        return
    if not isinstance(node, dict):
        return
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/components/schemas/"):
        name = ref.rsplit("/", 1)[-1]
        if name not in seen:
            seen.add(name)
            _close_objects(schemas[name], schemas, seen)
        return
    kind = node.get("type")
    is_object = kind == "object" or (isinstance(kind, list) and "object" in kind)
    if is_object and "properties" in node and "additionalProperties" not in node:
        node["additionalProperties"] = False
    for key, value in node.items():
        if key not in ("if", "then", "else", "not", "examples", "example", "const", "enum"):
            _close_objects(value, schemas, seen)


def strict_document(document: dict[str, Any],
                    overlay: dict[str, Any] | None = None) -> dict[str, Any]:
    """A copy of ``document`` with the strict overlay (default: ``strict.yaml``) applied."""
    overlay = strict_overlay() if overlay is None else overlay
    doc = copy.deepcopy(document)
    for patch in overlay.get("patches") or []:
        op = next(k for k in ("set", "merge", "extend") if k in patch)
        pointer, value = patch[op], copy.deepcopy(patch["value"])
        if op == "set":
            *parents, leaf = _split(pointer)
            parent = _at(doc, "/" + "/".join(_escape(p) for p in parents)) if parents else doc
            parent[leaf] = value
        elif op == "merge":
            _at(doc, pointer).update(value)
        else:
            _at(doc, pointer).extend(value)
    for pointer, types in (overlay.get("error_types") or {}).items():
        response = _at(doc, pointer)
        response["x-error-types"] = list(response.get("x-error-types") or []) + list(types)
    if overlay.get("close_response_objects"):
        schemas = doc.get("components", {}).get("schemas", {})
        responses = doc.get("components", {}).get("responses", {})
        seen: set[str] = set()
        for path, item in doc["paths"].items():
            if not path.startswith(_API_PREFIX):
                continue  # the mock's control plane is not the contract
            for op_ in item.values():
                if not isinstance(op_, dict):
                    continue
                for response in (op_.get("responses") or {}).values():
                    ref = response.get("$ref") if isinstance(response, dict) else None
                    if isinstance(ref, str):
                        response = responses[ref.rsplit("/", 1)[-1]]
                    for media in (response.get("content") or {}).values():
                        _close_objects(media.get("schema"), schemas, seen)
    doc["x-profile"] = "strict"
    return doc


def _describe(error: jsonschema.ValidationError) -> str:
    """An error's message; for a ``oneOf``/``anyOf`` that no branch matches (e.g. an
    operation record, one branch per primitive), the first problem of the branch with the
    fewest, instead of the whole instance repeated."""
    if error.validator in ("oneOf", "anyOf") and error.context:
        branches: dict[Any, list[jsonschema.ValidationError]] = {}
        for sub in error.context:
            branches.setdefault(sub.relative_schema_path[0], []).append(sub)
        nearest = min(branches.values(), key=len)
        sub = min(nearest, key=lambda e: [str(p) for p in e.absolute_path])
        where = "/".join(str(p) for p in sub.absolute_path) or "(root)"
        return (f"matches no branch of its {error.validator}; the nearest fails at {where}: "
                f"{_describe(sub)}")
    return str(error.message)


@dataclass(frozen=True)
class _PathTemplate:
    template: str  # as written in the document, e.g. /v1/training/runs/{run_id}
    regex: re.Pattern[str]
    literal_chars: int


class OpenAPI:
    """A loaded contract document plus response validation."""

    def __init__(self, document: dict[str, Any], source: str, profile: str = "contract") -> None:
        if not isinstance(document, dict) or "paths" not in document:
            raise ValueError(f"{source}: not an OpenAPI document (no 'paths')")
        if profile not in PROFILES:
            raise ValueError(f"unknown profile {profile!r} (one of {', '.join(PROFILES)})")
        self.document = strict_document(document) if profile == "strict" else document
        self.source = source
        self.profile = profile
        self.prefix = self._server_prefix(document)
        self._templates = [self._compile(t) for t in document["paths"]]
        resource = DRAFT202012.create_resource(self.document)
        self._registry = referencing.Registry().with_resource(_DOC_URI, resource)

    @classmethod
    def load(cls, path: str | Path | None = None, *, profile: str = "contract") -> OpenAPI:
        """The packaged contract, or the document at ``path``, as ``profile`` reads it."""
        return _load_cached(None if path is None else str(Path(path).resolve()), profile)

    def as_profile(self, profile: str) -> OpenAPI:
        """The same document read by another profile (strict: with the overlay applied)."""
        if profile == self.profile:
            return self
        if self.profile != "contract":
            raise ValueError("only a contract document can be read by another profile")
        return OpenAPI(self.document, self.source, profile=profile)

    @staticmethod
    def _server_prefix(document: dict[str, Any]) -> str:
        # A server URL like "https://host/v1/training" or "/v1/training" puts the prefix there
        # instead of in every path key.
        for server in document.get("servers") or []:
            url = str(server.get("url", ""))
            match = re.match(r"^(?:[a-z]+://[^/]+)?(/.*)?$", url)
            if match and match.group(1):
                return match.group(1).rstrip("/")
        return ""

    @staticmethod
    def _compile(template: str) -> _PathTemplate:
        pattern = ""
        literal = 0
        for part in re.split(r"(\{[^}]+\})", template):
            if part.startswith("{") and part.endswith("}"):
                pattern += r"[^/]+"
            else:
                pattern += re.escape(part)
                literal += len(part)
        return _PathTemplate(template, re.compile(f"^{pattern}$"), literal)

    # ------------------------------------------------------------------ lookup
    def match_path(self, path: str) -> str | None:
        """The document's path template for a concrete path under ``/v1/training``.

        ``path`` may include the ``/v1/training`` prefix or not; the most literal match wins
        (``/runs/{run_id}/finish`` beats ``/runs/{run_id}/{primitive}``).
        """
        api = "/v1/training"
        candidates = {path}
        if path.startswith(api):
            candidates.add(path[len(api):] or "/")
        else:
            candidates.add(api + path)
        if self.prefix and path.startswith(self.prefix):
            candidates.add(path[len(self.prefix):] or "/")
        best: _PathTemplate | None = None
        for entry in self._templates:
            if any(entry.regex.match(c) for c in candidates):
                if best is None or entry.literal_chars > best.literal_chars:
                    best = entry
        return best.template if best else None

    def operation(self, method: str, template: str) -> dict[str, Any] | None:
        item = self.deref(self.document["paths"].get(template) or {})
        op = item.get(method.lower())
        return self.deref(op) if isinstance(op, dict) else None

    def deref(self, node: Any) -> Any:
        """Follow local ``$ref`` (``#/components/...``) until a non-reference object."""
        seen = 0
        while isinstance(node, dict) and isinstance(node.get("$ref"), str):
            ref = node["$ref"]
            if not ref.startswith("#/"):
                raise ValueError(f"only local references are supported, got {ref!r}")
            target: Any = self.document
            for segment in ref[2:].split("/"):
                target = target[segment.replace("~1", "/").replace("~0", "~")]
            node = target
            seen += 1
            if seen > 32:
                raise ValueError(f"reference loop at {ref!r}")
        return node

    def _response_entry(self, op: dict[str, Any], status: int) -> tuple[str, Any] | None:
        responses = op.get("responses") or {}
        for key in (str(status), f"{str(status)[0]}XX", f"{str(status)[0]}xx", "default"):
            if key in responses:
                return key, responses[key]
        return None

    # -------------------------------------------------------------- validation
    def validate_response(self, method: str, path: str, status: int,
                          headers: dict[str, str] | Any, body: bytes) -> list[str]:
        """Problems with one response (an empty list means it conforms)."""
        template = self.match_path(path)
        if template is None:
            return [f"path {path} is not in {self.source}"]
        op = self.operation(method, template)
        if op is None:
            return [f"{method} {template} is not documented"]
        found = self._response_entry(op, status)
        if found is None:
            documented = sorted((op.get("responses") or {}).keys())
            return [f"{method} {template}: status {status} not documented ({documented})"]
        key, response = found
        response = self.deref(response)
        problems: list[str] = []
        lower = {k.lower(): v for k, v in dict(headers).items()}
        for name, header in (response.get("headers") or {}).items():
            header = self.deref(header)
            if name.lower() not in lower:
                if header.get("required"):
                    problems.append(f"{method} {template} {status}: required header {name} "
                                    f"missing")
                continue
            problem = self._header_problem(header.get("schema"), str(lower[name.lower()]))
            if problem:
                problems.append(f"{method} {template} {status}: header {name}: {problem}")
        content = response.get("content") or {}
        if not content:
            if body:
                problems.append(f"{method} {template} {status}: body where none is documented")
            return problems
        ctype = str(lower.get("content-type", "")).split(";")[0].strip().lower()
        media_key = next((m for m in content if m.lower() == ctype), None)
        if media_key is None:
            media_key = next((m for m in content if m.endswith("/*")
                              and ctype.startswith(m[:-1])), None)
        if media_key is None:
            problems.append(f"{method} {template} {status}: content type {ctype!r} not in "
                            f"{sorted(content)}")
            return problems
        if not (media_key.endswith("json") or ctype.endswith("json")):
            return problems  # binary downloads: bytes and digests are checked by EXPORT-1
        try:
            instance = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            problems.append(f"{method} {template} {status}: body is not JSON ({exc})")
            return problems
        allowed = response.get("x-error-types") if self.profile == "strict" else None
        if isinstance(allowed, list) and isinstance(instance, dict) and isinstance(
                instance.get("error"), dict) and instance["error"].get("type") not in allowed:
            problems.append(f"{method} {template} {status}: error.type "
                            f"{instance['error'].get('type')!r} not in x-error-types {allowed}")
        media = self.deref(content[media_key])
        if "schema" not in media:
            return problems
        pointer = self._pointer_of(("paths", template, method.lower(), "responses", key))
        pointer += "/" + "/".join(_escape(s) for s in ("content", media_key))
        pointer = self._pointer_of(pointer) + "/schema"
        validator = self._validator(pointer)
        for error in sorted(validator.iter_errors(instance), key=lambda e: list(e.path))[:5]:
            where = "/".join(str(p) for p in error.absolute_path) or "(root)"
            problems.append(f"{method} {template} {status}: body at {where}: "
                            f"{_describe(error)}"[:400])
        return problems

    def _header_problem(self, schema: Any, value: str) -> str | None:
        """Why a header value does not match its (simple, scalar) schema, or None."""
        schema = self.deref(schema)
        if not isinstance(schema, dict):
            return None
        instance: Any = value
        if schema.get("type") == "integer":
            if not re.fullmatch(r"-?\d+", value.strip()):
                return f"{value!r} is not an integer"
            instance = int(value)
        errors = list(jsonschema.Draft202012Validator(schema).iter_errors(instance))
        return f"{value!r}: {errors[0].message}" if errors else None

    def _pointer_of(self, location: tuple[str, ...] | str) -> str:
        """JSON pointer of the object at ``location`` after following its ``$ref`` chain."""
        pointer = location if isinstance(location, str) else "/" + "/".join(
            _escape(s) for s in location)
        for _ in range(32):
            node: Any = self.document
            for segment in pointer[1:].split("/"):
                node = node[segment.replace("~1", "/").replace("~0", "~")]
            if not (isinstance(node, dict) and isinstance(node.get("$ref"), str)):
                return pointer
            pointer = node["$ref"][1:]
        raise ValueError(f"reference loop at {pointer!r}")

    @lru_cache(maxsize=512)  # noqa: B019 - one OpenAPI document per process, never freed
    def _validator(self, pointer: str) -> jsonschema.Draft202012Validator:
        ref = {"$ref": f"{_DOC_URI}#{quote(pointer, safe='/~')}"}
        return jsonschema.Draft202012Validator(ref, registry=self._registry)


@lru_cache(maxsize=8)
def _load_cached(path: str | None, profile: str) -> OpenAPI:
    if path is None:
        document = yaml.load(contract_bytes(), Loader=_Loader)
        return OpenAPI(document, source=_PACKAGED_SOURCE, profile=profile)
    with open(path, "rb") as handle:
        document = yaml.load(handle, Loader=_Loader)
    return OpenAPI(document, source=path, profile=profile)
