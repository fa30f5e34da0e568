"""What stands between a client and the service layer: a body-size cap and JSON errors.

``BodyLimit`` is plain ASGI middleware: a request whose Content-Length (or, when chunked, whose
bytes as they arrive) exceeds ``max_bytes`` is answered 413 before any handler parses it.
``install_error_handlers`` turns every failure into ``{"error": message, ...}`` with a 4xx code,
so the page can show the message: inferlab's typed errors (400), schema violations (422), unknown
routes (404), wrong methods (405).
"""

from __future__ import annotations

import json
from typing import Any

MAX_BODY_BYTES = 16 * 1024  # the largest request body: every body here is a handful of fields


def _json_error(status: int, message: str, **extra: Any) -> tuple[int, bytes]:
    return status, json.dumps({"error": message, **extra}).encode()


class BodyLimit:
    """Reject request bodies over ``max_bytes`` with 413 (declared or streamed)."""

    def __init__(self, app, max_bytes: int = MAX_BODY_BYTES):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        for k, v in scope.get("headers", ()):
            if k == b"content-length":
                try:
                    declared = int(v)
                except ValueError:
                    return await self._reply(send, *_json_error(400, f"Content-Length is not a number: {v[:40]!r}"))
                if declared > self.max_bytes:
                    return await self._reply(send, *_json_error(
                        413, f"request body of {declared} bytes is over the limit of {self.max_bytes} bytes"))
        seen = 0
        started = False

        async def limited_receive():
            nonlocal seen
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > self.max_bytes:
                    raise _TooLarge(seen)
            return msg

        async def tracking_send(msg):
            nonlocal started
            if msg["type"] == "http.response.start":
                started = True
            await send(msg)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except _TooLarge as exc:
            if not started:
                await self._reply(send, *_json_error(
                    413, f"request body of over {exc.n_bytes} bytes is over the limit of {self.max_bytes} bytes"))

    @staticmethod
    async def _reply(send, status: int, body: bytes) -> None:
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


class _TooLarge(Exception):
    def __init__(self, n_bytes: int):
        super().__init__(n_bytes)
        self.n_bytes = n_bytes


def _where(loc: tuple) -> str:
    parts = [str(p) for p in loc if p not in ("body",)]
    return ".".join(parts) or "body"


def install_error_handlers(app) -> None:
    from fastapi import Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from starlette.exceptions import HTTPException as StarletteHTTPException

    from ..errors import InferlabError

    @app.exception_handler(InferlabError)
    async def _inferlab(request: Request, exc: InferlabError):
        return JSONResponse({"error": str(exc), "type": type(exc).__name__}, status_code=400)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        errs = []
        for e in exc.errors():
            if e.get("type") == "json_invalid":
                errs.append({"field": "body", "message": "the body is not valid JSON", "input": str(e.get("ctx", {}).get("error", ""))[:60]})
                continue
            where = _where(tuple(e.get("loc", ())))
            got = e.get("input")
            shown = repr(got)[:60] if not isinstance(got, (dict, list)) else type(got).__name__
            errs.append({"field": where, "message": e.get("msg", "invalid"), "input": shown})
        first = errs[0] if errs else {"field": "body", "message": "invalid request", "input": ""}
        msg = f"{first['field']}: {first['message']} (got {first['input']})"
        if len(errs) > 1:
            msg += f"; and {len(errs) - 1} more"
        return JSONResponse({"error": msg, "errors": errs}, status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        msg = exc.detail if isinstance(exc.detail, str) else "request refused"
        if exc.status_code == 404:
            msg = f"no such endpoint: {request.method} {request.url.path[:120]}"
        elif exc.status_code == 405:
            msg = f"{request.method} is not allowed on {request.url.path[:120]}"
        return JSONResponse({"error": msg}, status_code=exc.status_code, headers=getattr(exc, "headers", None))
