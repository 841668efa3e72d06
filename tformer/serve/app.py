"""``create_app``: the FastAPI application over one loaded checkpoint.

Endpoints: ``GET /health``, ``GET /v1/model``, ``POST /v1/translate`` (JSON, or server-sent
events with ``"stream": true``), ``POST /v1/attention``, ``POST /v1/explain``, the web page at
``GET /``; OpenAPI at ``/openapi.json`` and ``/docs``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.responses import HTMLResponse, StreamingResponse

from tformer.checkpoint.store import Checkpoint
from tformer.decoding.settings import DecodingConfig
from tformer.errors import ConfigError
from tformer.fast.accelerate import accelerate
from tformer.fast.int8 import is_quantized
from tformer.serve.limits import BodyLimit, install_handlers
from tformer.serve.page import page_html
from tformer.serve.schemas import AttentionRequest, ExplainRequest, TranslateRequest
from tformer.serve.service import Service
from tformer.serve.settings import ServeSettings
from tformer.serve.stream import Emit, decode_streamed, relay
from tformer.version import __version__


def create_app(
    loaded: Checkpoint, settings: ServeSettings | None = None, *, quantize: str = "none"
) -> FastAPI:
    """The application serving ``loaded`` (its model gets tformer's speed-ups unless it is
    already int8). The decoding worker starts and stops with the application's lifespan."""
    if not is_quantized(loaded.model):
        accelerate(loaded.model)
    service = Service(loaded, settings or ServeSettings(), quantize=quantize)

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
    app.add_middleware(BodyLimit, limit=service.settings.max_body_bytes)
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
        src = service.encode(texts)
        service.check_rows(len(texts), config)
        if request.stream:
            return _stream(service, texts, src, config)
        hyps = await asyncio.wrap_future(service.batcher.submit(src, config))
        return service.outputs(texts, hyps, config)

    @app.post("/v1/attention")
    async def attention(request: AttentionRequest) -> dict[str, Any]:
        """The attention maps of the source with the target (given, or the model's output):
        encoder, decoder or cross; one layer or all; one head, all or their mean."""
        decoding = DecodingConfig(temperature=request.temperature, seed=request.seed)
        service.encode([request.source], "source")
        if request.target is not None:
            target_ids = service.loaded.tokenizers.target.encode(request.target)
            service.check_length(target_ids, "target")
        work = service.batcher.call(lambda: service.attention(request, decoding))
        return await asyncio.wrap_future(work)

    @app.post("/v1/explain")
    async def explain(request: ExplainRequest) -> dict[str, Any]:
        """Why each token of one output: its probability after each logit processor, the
        alternatives, and the source tokens attended to (``tformer generate --explain``)."""
        config = service.decoding_config(request)
        src = service.encode([request.source], "source")[0]
        if request.target is not None:
            service.check_length(service.loaded.tokenizers.target.encode(request.target), "target")
        work = service.batcher.call(lambda: service.explanation(request, src, config))
        return await asyncio.wrap_future(work)


def _stream(
    service: Service, texts: list[str], src: list[list[int]], config: DecodingConfig
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
        return service.batcher.call(
            lambda: decode_streamed(
                loaded.model, loaded.tokenizers, texts[0], src[0], config, emit, cancelled
            )
        )

    return StreamingResponse(
        relay(start),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
