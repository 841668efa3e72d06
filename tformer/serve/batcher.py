"""One worker thread owns the model; requests that arrive together are decoded together.

A request's inputs become a ``Job``. The worker takes the first job waiting, then keeps
collecting for ``window`` seconds or until the jobs' token cost reaches ``max_batch_tokens``.
Jobs with equal decoding settings are decoded in one ``decode_texts`` call; other settings
in their own calls, one after the other. Each input's result does not depend on what it was
batched with: greedy decoding picks the same tokens, and sampling draws from a random stream
keyed by (seed, the input's token ids, the sample index) (``tformer.decoding.sampling``).

Anything else that needs the model (streams, attention maps, explanations) is a ``Call``,
run by the same worker between batches: torch modules are not shared between threads.

At most ``max_waiting`` jobs and calls wait for the worker; one more is refused with ``Busy``
at once, so a flood of requests costs a refusal each, not memory and ever-growing latency.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from tformer.decoding.api import decode_texts
from tformer.decoding.ensemble import Decodable
from tformer.decoding.settings import MAX_ROWS, DecodingConfig, Hypothesis
from tformer.errors import TformerError


@dataclass
class Job:
    """Some inputs (token ids) to decode with one setting."""

    src: list[list[int]]
    config: DecodingConfig
    future: Future[list[list[Hypothesis]]] = field(default_factory=Future)

    @property
    def rows(self) -> int:
        return len(self.src) * self.config.rows_per_input

    @property
    def cost(self) -> int:
        """Rows x (source tokens + new tokens): the batch budget's unit."""
        width = self.rows // max(1, len(self.src))
        return sum(width * (len(ids) + self.config.max_new_tokens) for ids in self.src)


@dataclass
class Call:
    """A function run by the worker (it may use the model)."""

    function: Callable[[], Any]
    future: Future[Any] = field(default_factory=Future)


_STOP = object()


class Busy(TformerError):
    """Too many requests are waiting for the worker; the client should retry later (503)."""


class Batcher:
    """The worker thread and its queue."""

    def __init__(
        self, model: Decodable, *, window_s: float, max_batch_tokens: int, max_waiting: int
    ) -> None:
        self.model = model
        self.window_s = window_s
        self.max_batch_tokens = max_batch_tokens
        self.max_waiting = max_waiting
        self.batches = 0  # decode_texts calls made (a test reads it to see batching happen)
        self._queue: queue.Queue[object] = queue.Queue(maxsize=max_waiting)
        self._thread = threading.Thread(target=self._loop, name="tformer-decoder", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Finish everything queued, then end the worker."""
        self._queue.put(_STOP)  # waits for room: the worker is draining the queue
        self._thread.join()

    def submit(self, src: Sequence[Sequence[int]], config: DecodingConfig) -> Future[Any]:
        job = Job([list(ids) for ids in src], config)
        self._enqueue(job)
        return job.future

    def call(self, function: Callable[[], Any]) -> Future[Any]:
        item = Call(function)
        self._enqueue(item)
        return item.future

    def _enqueue(self, item: Job | Call) -> None:
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            raise Busy(
                f"the server is busy: {self.max_waiting} requests are already waiting "
                "(--max-queue); retry shortly"
            ) from None

    def _loop(self) -> None:
        stopping = False
        while not stopping:
            first = self._queue.get()
            if first is _STOP:
                return
            items, stopping = self._collect(first)
            self._run(items)

    def _collect(self, first: object) -> tuple[list[object], bool]:
        """The first item and what arrives in the window; whether the stop sign came."""
        items = [first]
        if not isinstance(first, Job):
            return items, False
        cost, deadline = first.cost, time.monotonic() + self.window_s
        while cost < self.max_batch_tokens:
            remaining = max(0.0, deadline - time.monotonic())
            try:
                item = self._queue.get(timeout=remaining) if remaining else self._queue.get_nowait()
            except queue.Empty:
                break
            if item is _STOP:
                return items, True
            items.append(item)
            if isinstance(item, Job):
                cost += item.cost
        return items, False

    def _run(self, items: list[object]) -> None:
        groups: dict[DecodingConfig, list[Job]] = {}
        for item in items:
            if isinstance(item, Job):
                groups.setdefault(item.config, []).append(item)
        for config, jobs in groups.items():
            self._decode(config, jobs)
        for item in items:
            if isinstance(item, Call):
                _settle(item.future, item.function)

    def _decode(self, config: DecodingConfig, jobs: list[Job]) -> None:
        rows = sum(job.rows for job in jobs)
        src = [ids for job in jobs for ids in job.src]
        try:
            self.batches += 1
            hyps = decode_texts(self.model, src, config, batch_size=min(MAX_ROWS, rows))
        except BaseException as error:  # every waiting request hears of it
            for job in jobs:
                job.future.set_exception(error)
            if not isinstance(error, Exception):
                raise
            return
        start = 0
        for job in jobs:
            job.future.set_result(hyps[start : start + len(job.src)])
            start += len(job.src)


def _settle(future: Future[Any], function: Callable[[], Any]) -> None:
    try:
        future.set_result(function())
    except Exception as error:
        future.set_exception(error)
