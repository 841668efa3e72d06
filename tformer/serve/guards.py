"""Checks on a request's headers before anything reads its body: ``Host`` and content type.

``AllowedHosts`` answers only the ``Host`` values of ``--allowed-hosts`` (by default the bound
address and the loopback names): a page on another site that rebinds its DNS name to this
machine sends its own name as ``Host`` and gets 400, so it cannot read the answers (DNS
rebinding). Starlette's ``TrustedHostMiddleware`` does the same, but answers in plain text
and matches no port; this one refuses in the API's one-line JSON shape and names the option.

``JsonOnly`` refuses a ``POST`` whose body is not declared JSON (415): a form or ``text/plain``
body would otherwise reach the validator as bytes, and a cross-site page can send those
without the browser asking the server first.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from tformer.paths import excerpt
from tformer.serve.limits import error
from tformer.serve.settings import split_host


class AllowedHosts:
    """ASGI middleware: 400 for a ``Host`` header not in ``allowed`` (see ``ServeSettings.hosts``);
    a request without one (HTTP/1.0) is answered."""

    def __init__(self, app: ASGIApp, allowed: tuple[str, ...]) -> None:
        self.app = app
        self.any = "*" in allowed
        self.allowed = [split_host(entry) for entry in allowed if entry != "*"]
        self.shown = ", ".join(allowed)

    def answers(self, value: bytes) -> bool:
        parsed = split_host(value.decode("latin-1"))
        if parsed is None:
            return False
        host, port = parsed
        return any(
            entry is not None and entry[0] == host and entry[1] in (None, port)
            for entry in self.allowed
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.any:
            await self.app(scope, receive, send)
            return
        value = dict(scope.get("headers", [])).get(b"host")
        if value is None or self.answers(value):
            await self.app(scope, receive, send)
            return
        shown = excerpt(value.decode("latin-1"), 80)
        await error(
            400,
            f"Host {shown} is not a name this server answers to (--allowed-hosts: {self.shown}); "
            "add it with tformer serve --allowed-hosts",
        )(scope, receive, send)


JSON = "application/json"


class JsonOnly:
    """ASGI middleware: a ``POST`` must declare a JSON body (``application/json`` or
    ``application/*+json``, in UTF-8), else 415 naming the type expected."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            problem = content_type_problem(dict(scope.get("headers", [])).get(b"content-type"))
            if problem is not None:
                await error(415, problem)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def content_type_problem(value: bytes | None) -> str | None:
    """Why a ``Content-Type`` header is not a JSON body's, or None when it is."""
    expected = f"send the body as JSON with the header Content-Type: {JSON}"
    if value is None:
        return f"the request has no Content-Type; {expected}"
    text = value.decode("latin-1")
    media, *parameters = (part.strip().lower() for part in text.split(";"))
    if media != JSON and not (media.startswith("application/") and media.endswith("+json")):
        return f"Content-Type {excerpt(text, 80)} is not JSON; {expected}"
    for parameter in parameters:
        name, _, charset = parameter.partition("=")
        if name.strip() == "charset" and charset.strip().strip('"') not in ("utf-8", "utf8"):
            return f"Content-Type {excerpt(text, 80)}: JSON is read as UTF-8; {expected}"
    return None
