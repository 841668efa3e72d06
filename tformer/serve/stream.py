"""Streamed decoding of one input: each token as it is chosen, as server-sent events.

The decoding runs in the worker (``Batcher.call``); each event crosses to the event loop
through ``emit``. The tokens are those ``decode_texts`` gives with the same settings
(``tformer.decoding.sampling.sample_steps`` is the one loop behind both).
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future
from typing import Any

import torch

from tformer.checkpoint.store import Tokenizers
from tformer.config import EOS_ID
from tformer.decoding.api import fit_source
from tformer.decoding.ensemble import Decodable
from tformer.decoding.sampling import sample_steps
from tformer.decoding.settings import DecodingConfig, Hypothesis
from tformer.errors import TformerError
from tformer.serve.answers import output_record, settings_record
from tformer.serve.limits import unexpected

Emit = Callable[[str, dict[str, Any]], None]


def decode_streamed(
    model: Decodable,
    tokenizers: Tokenizers,
    text: str,
    src_ids: list[int],
    config: DecodingConfig,
    emit: Emit,
    cancelled: threading.Event,
) -> None:
    """Decode each sample of one input token by token, emitting a "token" event per token
    and a "done" event with every output; stop early when ``cancelled`` is set."""
    target = tokenizers.target
    device = next(model.parameters()).device
    src = torch.tensor([fit_source(src_ids, model.config.max_len)], device=device)
    outputs = []
    for sample in range(config.num_samples):
        steps = sample_steps(model, src, config, samples=[sample])
        ids: list[int] = []
        while True:
            try:
                _, tokens = next(steps)
            except StopIteration as stop:
                hyp: Hypothesis = stop.value[0][0]
                break
            if cancelled.is_set():
                steps.close()
                return
            if tokens[0] != EOS_ID:
                ids.append(tokens[0])
                emit(
                    "token",
                    {
                        "sample": sample,
                        "id": tokens[0],
                        "token": target.id_to_token(tokens[0]),
                        "text": target.decode(ids),
                    },
                )
        text_out = target.decode(hyp.ids)
        outputs.append(output_record(text_out, hyp, sample, config, target.tokens(hyp.ids)))
    emit("done", {"input": text, "outputs": outputs, "settings": settings_record(config)})


def event_text(event: str, data: dict[str, Any]) -> str:
    """One server-sent event (its JSON data on one line)."""
    return f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"


def relay(
    start: Callable[[Emit, threading.Event], Future[Any]],
) -> AsyncIterator[str]:
    """The events of a decoding started by ``start(emit, cancelled)``, as SSE text.

    A client that goes away sets ``cancelled``, and the worker stops at its next token.
    """
    loop = asyncio.get_running_loop()
    events: asyncio.Queue[tuple[str, dict[str, Any]] | None] = asyncio.Queue()
    cancelled = threading.Event()

    def emit(event: str, data: dict[str, Any]) -> None:
        loop.call_soon_threadsafe(events.put_nowait, (event, data))

    future = start(emit, cancelled)
    future.add_done_callback(lambda _: loop.call_soon_threadsafe(events.put_nowait, None))

    async def body() -> AsyncIterator[str]:
        try:
            while (item := await events.get()) is not None:
                yield event_text(*item)
            problem = future.exception()
            if problem is not None:
                _, message = (
                    (0, str(problem)) if isinstance(problem, TformerError) else unexpected(problem)
                )
                yield event_text("error", {"error": " ".join(message.split())})
        finally:
            cancelled.set()

    return body()
