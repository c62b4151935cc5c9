"""A stateless generic server made from ``openapi.yaml`` alone, as a generic mock tool would
serve it: it checks that a bearer key is present and that the body is JSON matching the
operation's request schema (401, 400, 422 otherwise), then answers the operation's first 2xx
example. It keeps no state and ignores what the request asks, so every check that passes
against it must be one a stateless server can honestly pass (``test_conformance_vacuous.py``).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import orjson
from jsonschema import Draft202012Validator
from referencing import Registry
from referencing.jsonschema import DRAFT202012
from starlette.requests import Request
from starlette.responses import Response

from conformance.schema import OpenAPI

URI = "urn:stateless"


def _example(document: dict[str, Any], op: dict[str, Any]) -> tuple[int, bytes, str]:
    for status in sorted(code for code in op["responses"] if code.startswith("2")):
        response = op["responses"][status]
        if "$ref" in response:
            response = document["components"]["responses"][response["$ref"].rsplit("/", 1)[-1]]
        for media_type, media in (response.get("content") or {}).items():
            values = [e["value"] for e in (media.get("examples") or {}).values()]
            values += [media["example"]] if "example" in media else []
            if values:
                return int(status), orjson.dumps(values[0]), media_type
    return 204, b"", "application/json"


def stateless_app() -> Any:
    spec = OpenAPI.load()
    document = spec.document
    registry = Registry().with_resource(URI, DRAFT202012.create_resource(document))

    def answer(status: int, body: bytes, media_type: str = "application/json") -> Response:
        return Response(body, status, {"X-Request-Id": "stateless"}, media_type=media_type)

    def error(status: int, kind: str) -> Response:
        return answer(status, orjson.dumps({"error": {"type": kind, "message": kind,
                                                      "details": {}}}))

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        request = Request(scope, receive)
        template = spec.match_path(request.url.path)
        op = spec.operation(request.method, template) if template else None
        if op is None:
            response = error(404, "not_found")
        elif not request.headers.get("authorization", "").startswith("Bearer "):
            response = error(401, "unauthorized")
        else:
            response = await _respond(request, template, op)
        await response(scope, receive, send)

    async def _respond(request: Request, template: str, op: dict[str, Any]) -> Response:
        if "requestBody" in op:
            try:
                body = orjson.loads(await request.body() or b"{}")
            except orjson.JSONDecodeError:
                return error(400, "invalid_request")
            pointer = "/paths/" + template.replace("~", "~0").replace("/", "~1") + \
                f"/{request.method.lower()}/requestBody/content/application~1json/schema"
            validator = Draft202012Validator({"$ref": f"{URI}#{quote(pointer, safe='/~')}"},
                                             registry=registry)
            if not validator.is_valid(body):
                return error(422, "invalid_request")
        return answer(*_example(document, op))

    return app
