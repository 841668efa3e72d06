"""``create_app``: the FastAPI application over one loaded checkpoint.

Endpoints: ``GET /health``, ``GET /v1/model``, ``POST /v1/translate`` (JSON, or server-sent
events with ``"stream": true``), ``POST /v1/attention``, ``POST /v1/explain``, the web page at
``GET /``; OpenAPI at ``/openapi.json`` and ``/docs``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.responses import HTMLResponse, StreamingResponse

from tformer.checkpoint.store import Checkpoint
from tformer.decoding.ensemble import Decodable, accelerate_members
from tformer.decoding.settings import DecodingConfig
from tformer.errors import ConfigError
from tformer.serve.guards import AllowedHosts, JsonOnly
from tformer.serve.limits import BodyLimit, install_handlers
from tformer.serve.page import page_html
from tformer.serve.schemas import AttentionRequest, ExplainRequest, TranslateRequest
from tformer.serve.service import Service
from tformer.serve.settings import ServeSettings
from tformer.serve.stream import Emit, decode_streamed, relay
from tformer.version import __version__


def create_app(
    loaded: Checkpoint,
    settings: ServeSettings | None = None,
    *,
    quantize: str = "none",
    model: Decodable | None = None,
    members: Sequence[str] = (),
) -> FastAPI:
    """The application serving ``loaded`` (its model gets tformer's speed-ups unless it is
    already int8), or ``model``, an ensemble of it and others (their checkpoints
    ``members``). The decoding worker starts and stops with the application's lifespan."""
    service = Service(
        loaded, settings or ServeSettings(), quantize=quantize, model=model, members=members
    )
    accelerate_members(service.model)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        service.batcher.start()
        try:
            yield
        finally:  # uvicorn has answered every request in flight by now
            service.batcher.stop()

    app = FastAPI(
        title="tformer serve",
        version=__version__,
        description="Translate with a tformer checkpoint; see docs/serve.md.",
        lifespan=lifespan,
    )
    app.state.service = service
    install_handlers(app)
    _routes(app, service)
    # Starlette runs the last added first: the Host is checked before anything else.
    app.add_middleware(JsonOnly)
    app.add_middleware(BodyLimit, limit=service.settings.max_body_bytes)
    app.add_middleware(AllowedHosts, allowed=service.settings.hosts())
    return app


def _routes(app: FastAPI, service: Service) -> None:
    page = page_html()

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def index() -> HTMLResponse:
        return HTMLResponse(page)

    @app.get("/health")
    async def health() -> dict[str, str]:
        """Answers while the server runs."""
        return {"status": "ok"}

    @app.get("/v1/model")
    async def model() -> dict[str, Any]:
        """The architecture, parameter counts, tokenizers and checkpoint manifest hash."""
        return service.model_info

    @app.post("/v1/translate", response_model=None)
    async def translate(request: TranslateRequest) -> dict[str, Any] | StreamingResponse:
        """Decode one or many inputs; ``"stream": true`` sends one input's tokens as
        server-sent events ("token" events, then "done" with the outputs)."""
        texts = [request.inputs] if isinstance(request.inputs, str) else request.inputs
        config = service.decoding_config(request)
        service.check_rows(len(texts), config)
        src = await asyncio.to_thread(service.encode, texts)
        warnings = service.warnings(src)
        if request.stream:
            return _stream(service, texts, src, config, warnings)
        hyps = await asyncio.wrap_future(service.batcher.submit(src, config))
        return service.outputs(texts, hyps, config, warnings)

    @app.post("/v1/attention")
    async def attention(request: AttentionRequest) -> dict[str, Any]:
        """The attention maps of the source with the target (given, or the model's output):
        encoder, decoder or cross; one layer or all; one head, all or their mean."""
        decoding = DecodingConfig(temperature=request.temperature, seed=request.seed)
        src, target = await _source_and_target(service, request.source, request.target)
        work = service.batcher.call(lambda: service.attention(request, decoding))
        return {**await asyncio.wrap_future(work), "warnings": service.warnings(src, target)}

    @app.post("/v1/explain")
    async def explain(request: ExplainRequest) -> dict[str, Any]:
        """Why each token of one output: its probability after each logit processor, the
        alternatives, and the source tokens attended to (``tformer generate --explain``)."""
        config = service.decoding_config(request)
        src, target = await _source_and_target(service, request.source, request.target)
        work = service.batcher.call(lambda: service.explanation(request, src[0], config, target))
        return {**await asyncio.wrap_future(work), "warnings": service.warnings(src, target)}


async def _source_and_target(
    service: Service, source: str, target: str | None
) -> tuple[list[list[int]], list[int] | None]:
    """A request's source and optional target as ids, tokenised off the event loop."""
    src = await asyncio.to_thread(service.encode, [source], "source")
    if target is None:
        return src, None
    return src, await asyncio.to_thread(service.encode_target, target)


def _stream(
    service: Service,
    texts: list[str],
    src: list[list[int]],
    config: DecodingConfig,
    warnings: list[str],
) -> StreamingResponse:
    if len(texts) != 1:
        raise ConfigError(f"stream sends one input's tokens; got {len(texts)} inputs")
    if config.beam_size > 1:
        raise ConfigError(
            f"stream with beam_size {config.beam_size}: beam search knows its best output "
            "only at the end; drop one of them"
        )
    loaded = service.loaded

    def start(emit: Emit, cancelled: threading.Event) -> Any:
        def emit_warned(event: str, data: dict[str, Any]) -> None:
            emit(event, {**data, "warnings": warnings} if event == "done" else data)

        return service.batcher.call(
            lambda: decode_streamed(
                service.model, loaded.tokenizers, texts[0], src[0], config, emit_warned,
                cancelled,
            )
        )

    return StreamingResponse(
        relay(start),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
