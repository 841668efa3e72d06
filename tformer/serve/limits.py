"""Refusals: every bad request gets a 4xx and ``{"error": "one line"}``; the server goes on.

``BodyLimit`` refuses a body over ``--max-body-bytes`` before anything reads it (413);
``install_handlers`` turns malformed JSON (400), wrong types and unknown fields (422),
impossible settings (``ConfigError``, 422), a full queue (503 with ``Retry-After``) and HTTP
errors (404, 405 ...) into one line.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tformer.errors import DataError, OutOfMemoryError, TformerError
from tformer.paths import excerpt, first_line
from tformer.serve.batcher import Busy

# What FastAPI says of a body it cannot decode (bytes that are not UTF-8, for one).
FASTAPI_UNREADABLE = "There was an error parsing the body"


def error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    """The one shape of every refusal."""
    return JSONResponse({"error": " ".join(message.split())}, status_code=status, headers=headers)


class BodyLimit:
    """ASGI middleware: a body over ``limit`` bytes gets a 413 before the application sees it.

    A declared length over the limit is refused at once; a body without one (chunked) is read
    here, counted, and handed on whole only when it fits.
    """

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    def message(self) -> str:
        return (
            f"request body is over {self.limit} bytes, this server's --max-body-bytes; "
            "send fewer or shorter inputs"
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers", [])).get(b"content-length")
        if declared is not None:
            if not declared.isdigit() or int(declared) > self.limit:
                await error(413, self.message())(scope, receive, send)
            else:
                await self.app(scope, receive, send)
            return
        body, more = bytearray(), True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.limit:
                await error(413, self.message())(scope, receive, send)
                return
        await self.app(scope, _replay(bytes(body), receive), send)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that gives ``body`` once, then waits on the real one (disconnects)."""
    given = False

    async def replayed() -> Message:
        nonlocal given
        if given:
            return await receive()
        given = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replayed


def validation_message(exc: RequestValidationError) -> tuple[int, str]:
    """(status, one line) for pydantic's list of problems: the first one, where it is."""
    problems = list(exc.errors())
    if not problems:
        return 422, "invalid request"
    first = problems[0]
    if first.get("type") == "json_invalid":
        detail = first.get("ctx", {}).get("error", "")
        return 400, f"the body is not valid JSON ({detail}); send a JSON object"
    where = ".".join(str(part) for part in first.get("loc", ()) if part != "body") or "body"
    kind = first.get("type", "")
    if kind == "extra_forbidden":
        return 422, f"{where}: unknown field; see /docs for the fields this endpoint takes"
    got = first.get("input")
    shown = "" if kind == "missing" else f" (got {excerpt(got)})"
    more = f" (and {len(problems) - 1} more problems)" if len(problems) > 1 else ""
    return 422, f"{where}: {first.get('msg', 'invalid')}{shown}{more}"


def install_handlers(app: FastAPI) -> None:
    """Every refusal as ``{"error": ...}``; a library refusal keeps its message."""

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        status, message = validation_message(exc)
        return error(status, message)

    @app.exception_handler(HTTPException)
    async def _http(request: Request, exc: HTTPException) -> JSONResponse:
        if exc.status_code == 400 and exc.detail == FASTAPI_UNREADABLE:
            return error(400, unreadable(exc.__cause__))
        return error(exc.status_code, str(exc.detail))

    @app.exception_handler(TformerError)
    async def _tformer(request: Request, exc: TformerError) -> JSONResponse:
        retry = {"Retry-After": "1"} if isinstance(exc, Busy) else None  # the queue drains fast
        return error(status_of(exc), str(exc), retry)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        return error(*unexpected(exc))


def unreadable(cause: BaseException | None) -> str:
    """Why a body that arrived whole could not be read as JSON, in one line."""
    if isinstance(cause, UnicodeDecodeError):
        return "the body is not UTF-8 JSON; send a JSON object in UTF-8"
    if isinstance(cause, RecursionError):
        return "the body's JSON is nested too deeply to read; send a JSON object of the fields"
    if isinstance(cause, ValueError) and "digits" in str(cause):  # Python's int size limit
        return "the body holds a number with too many digits to read; send smaller numbers"
    detail = f" ({first_line(cause)})" if cause is not None else ""
    return f"the body cannot be read as JSON{detail}; send a JSON object"


def unexpected(exc: BaseException) -> tuple[int, str]:
    """(status, one line) for an error no check foresaw: out of memory is 503, else 500."""
    text = str(exc).strip()
    detail = first_line(exc) if text else type(exc).__name__
    if isinstance(exc, MemoryError) or "out of memory" in text.lower():
        return 503, f"out of memory ({detail}); send fewer or shorter inputs, beams or samples"
    return 500, f"internal error ({type(exc).__name__}: {detail})"


def status_of(exc: TformerError) -> int:
    """A bad setting or input is the client's (422); running out of memory or room in the
    queue is ours (503)."""
    if isinstance(exc, (OutOfMemoryError, Busy)):
        return 503
    if isinstance(exc, DataError):
        return 422
    return 422 if exc.exit_code in (2, 3) else 500


def refusal(status: int, message: str) -> HTTPException:
    """Raise this from an endpoint to refuse with ``status`` and ``message``."""
    return HTTPException(status_code=status, detail=message)
