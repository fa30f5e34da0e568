"""What stands between a client and the service layer: a body-size cap and JSON errors.

``BodyLimit`` is plain ASGI middleware: a request whose Content-Length (or, when chunked, whose
bytes as they arrive) exceeds ``max_bytes`` is answered 413 before any handler sees it.
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
        # read the whole body first (it is small by construction), refusing it as soon as it is too big
        body, more = bytearray(), True
        while more:
            msg = await receive()
            if msg["type"] != "http.request":  # the client went away
                return
            body += msg.get("body", b"")
            more = msg.get("more_body", False)
            if len(body) > self.max_bytes:
                return await self._reply(send, *_json_error(
                    413, f"request body of over {len(body)} bytes is over the limit of {self.max_bytes} bytes"))
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    @staticmethod
    async def _reply(send, status: int, body: bytes) -> None:
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


# Everything the page needs comes from this server: scripts and styles from /static, data from /api.
# Inline styles stay allowed (the page sizes bars with style attributes); frames and plugins are not.
SECURITY_HEADERS = (
    (b"content-security-policy", b"default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
                                 b"connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'none'"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
)


class SecurityHeaders:
    """Add SECURITY_HEADERS to every response (plain ASGI, no per-request task)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def with_headers(msg):
            if msg["type"] == "http.response.start":
                msg = {**msg, "headers": [*msg.get("headers", []), *SECURITY_HEADERS]}
            await send(msg)

        await self.app(scope, receive, with_headers)


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

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception):
        # a bug, not bad input: say so in one line (the page shows it) and keep the traceback in the server's log
        import logging

        logging.getLogger("inferlab.web").exception("internal error on %s", request.url.path)
        return JSONResponse({"error": f"internal error ({type(exc).__name__}); this is a bug in inferlab, please report it",
                             "type": "InternalError"}, status_code=500)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        msg = exc.detail if isinstance(exc.detail, str) else "request refused"
        if exc.status_code == 404:
            msg = f"no such endpoint: {request.method} {request.url.path[:120]}"
        elif exc.status_code == 405:
            msg = f"{request.method} is not allowed on {request.url.path[:120]}"
        return JSONResponse({"error": msg}, status_code=exc.status_code, headers=getattr(exc, "headers", None))
