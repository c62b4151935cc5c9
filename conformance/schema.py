"""Validate every response the suite receives against ``openapi.yaml``.

Where the contract file comes from: there is one copy, ``conformance/openapi.yaml``, package
data read through :mod:`importlib.resources` wherever the package is installed. The
repository's ``openapi.yaml`` (the path the product promises) is a relative symlink to it
(``tests/test_conformance_schema.py`` checks both). ``--openapi PATH`` points the suite at
another file (for example a newer contract under review).

Validation of one response (:meth:`OpenAPI.validate_response`): the operation must be
documented for the method and path; the status must be documented (exact code, then ``4XX``
style ranges, then ``default``); documented required headers must be present; a JSON body must
be declared with a JSON media type and match the schema (JSON Schema 2020-12, local ``$ref``
resolved through a ``referencing`` registry that holds the whole document).
"""

from __future__ import annotations

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

__all__ = ["OpenAPI", "CONTRACT_RESOURCE", "contract_bytes"]

CONTRACT_RESOURCE = "openapi.yaml"  # package data of ``conformance``: the one copy
_PACKAGED_SOURCE = f"{__package__}/{CONTRACT_RESOURCE} (package data)"
_DOC_URI = "urn:whitney-openapi"


def contract_bytes() -> bytes:
    """The contract file as shipped in the package."""
    return resources.files(__package__).joinpath(CONTRACT_RESOURCE).read_bytes()


def _escape(segment: str) -> str:
    return segment.replace("~", "~0").replace("/", "~1")


@dataclass(frozen=True)
class _PathTemplate:
    template: str  # as written in the document, e.g. /v1/training/runs/{run_id}
    regex: re.Pattern[str]
    literal_chars: int


class OpenAPI:
    """A loaded contract document plus response validation."""

    def __init__(self, document: dict[str, Any], source: str) -> None:
        if not isinstance(document, dict) or "paths" not in document:
            raise ValueError(f"{source}: not an OpenAPI document (no 'paths')")
        self.document = document
        self.source = source
        self.prefix = self._server_prefix(document)
        self._templates = [self._compile(t) for t in document["paths"]]
        resource = DRAFT202012.create_resource(document)
        self._registry = referencing.Registry().with_resource(_DOC_URI, resource)

    @classmethod
    def load(cls, path: str | Path | None = None) -> "OpenAPI":
        """The packaged contract, or the document at ``path``."""
        if path is None:
            return _load_cached(None)
        return _load_cached(str(Path(path).resolve()))

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
            if header.get("required") and name.lower() not in lower:
                problems.append(f"{method} {template} {status}: required header {name} missing")
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
        allowed = response.get("x-error-types")
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
            problems.append(f"{method} {template} {status}: body at {where}: {error.message}"
                            [:400])
        return problems

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

    @lru_cache(maxsize=512)
    def _validator(self, pointer: str) -> jsonschema.Draft202012Validator:
        ref = {"$ref": f"{_DOC_URI}#{quote(pointer, safe='/~')}"}
        return jsonschema.Draft202012Validator(ref, registry=self._registry)


@lru_cache(maxsize=8)
def _load_cached(path: str | None) -> OpenAPI:
    if path is None:
        return OpenAPI(yaml.safe_load(contract_bytes()), source=_PACKAGED_SOURCE)
    with open(path, "rb") as handle:
        document = yaml.safe_load(handle)
    return OpenAPI(document, source=path)
