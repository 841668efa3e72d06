"""The model's decoding step captured as a CUDA graph: one launch per step instead of hundreds.

A small model's decoding step on a GPU is a few hundred short kernels, each launched from
Python, and the GPU mostly waits for the next launch. A CUDA graph records the step's kernels
once and replays them all with one launch. A graph replays fixed shapes at fixed addresses, so
the graphed step works on static tensors:

- each decoder layer's keys and values live in a buffer of fixed capacity; a step writes its
  position (a device tensor the graph reads) and attends over the whole buffer under a mask
  that hides the positions not yet written (:class:`tformer.fast.attention.StaticKVCache`);
- rows are padded to a power of two and the source to a multiple of ``SOURCE_BUCKET`` (the
  padding is masked); when the capacity is full, or the rows grow or shrink past their bucket,
  the state moves to the graph of the new shape.

Graphs are kept on the model per shape (:data:`KEPT_GRAPHS` at most), so the next batch of the
same shape reuses one without capturing it again. The outputs are the eager cached step's
(tests/test_cuda.py holds them equal); ``TFORMER_CUDA_GRAPHS=0`` turns graphs off.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from dataclasses import dataclass, field

import torch
from torch import Tensor

from tformer.fast.attention import StaticKVCache
from tformer.fast.step import FastTransformer
from tformer.model.cache import DecoderCache, KVCache, LayerCache
from tformer.model.layers import DecoderLayer
from tformer.model.transformer import EncoderOutput

CUDA_GRAPHS = "TFORMER_CUDA_GRAPHS"
FIRST_CAPACITY = 64  # positions a graph's caches hold at first; doubled when full
SOURCE_BUCKET = 32  # source lengths are padded to a multiple of this
KEPT_GRAPHS = 8  # graphs kept per model (each holds its own static caches)
DEVICES = ("cuda",)  # where the static step runs; elsewhere it is not captured (tests add "cpu")


def graphs_fit(model: object, encoded: EncoderOutput, prompts: Tensor | None) -> bool:
    """Whether ``model`` decodes ``encoded`` through graphed steps: a lean-step encoder-decoder
    in eval mode on a CUDA device, with positions added from a table (not RoPE, nor T5's
    relative bias)."""
    return (
        isinstance(model, FastTransformer)
        and not model.training
        and prompts is None
        and encoded.memory.device.type in DEVICES
        and os.environ.get(CUDA_GRAPHS, "1") != "0"
        and model.config.positions != "relative"  # its bias is not captured at a device offset
        and model.decoder.positions.vectors() is not None  # added from a table, not RoPE
    )


def _layers(model: FastTransformer) -> list[DecoderLayer]:
    layers = list(model.decoder.layers)
    assert all(isinstance(layer, DecoderLayer) for layer in layers)
    return layers  # type: ignore[return-value]


def _rows_bucket(rows: int) -> int:
    return 1 << max(rows - 1, 0).bit_length()


@dataclass(eq=False)
class StepGraph:
    """One captured step and the static tensors it reads and writes, for one shape."""

    model: FastTransformer
    rows: int  # padded rows
    capacity: int  # positions held
    source: int  # padded source length
    tokens: Tensor = field(init=False)  # (rows, 1) the newest token of each row
    pos: Tensor = field(init=False)  # (1,) the position this step writes
    memory_mask: Tensor = field(init=False)  # (rows, 1, 1, source) False on padding
    caches: list[LayerCache] = field(init=False)
    graph: torch.cuda.CUDAGraph | None = None
    logits: Tensor | None = None  # (rows, V), written by each replay
    busy: bool = False  # in use by a decoding (two decodings never share one)
    weights: tuple[tuple[int, int], ...] = ()  # the weights' signature it was captured over

    def __post_init__(self) -> None:
        model, device = self.model, self.model.output_weight().device
        self.weights = weights_signature(model)
        dtype = self.model.output_weight().dtype
        self.tokens = torch.zeros(self.rows, 1, dtype=torch.long, device=device)
        self.pos = torch.zeros(1, dtype=torch.long, device=device)
        self.memory_mask = torch.zeros(self.rows, 1, 1, self.source, dtype=torch.bool,
                                       device=device)  # fmt: skip
        self._positions = torch.arange(self.capacity, device=device)
        self.caches = []
        for layer in _layers(model):
            attention = layer.self_attn
            shape = (self.rows, attention.kv_heads, self.capacity, attention.d_k)
            k = torch.zeros(shape, dtype=dtype, device=device)
            v = torch.zeros(shape, dtype=dtype, device=device)
            cross = KVCache()
            cross_shape = (self.rows, layer.cross_attn.kv_heads, self.source, attention.d_k)
            cross.set(
                torch.zeros(cross_shape, dtype=dtype, device=device),
                torch.zeros(cross_shape, dtype=dtype, device=device),
            )
            self.caches.append(LayerCache(StaticKVCache(k, v, self.pos), cross))

    def forward(self) -> Tensor:
        """The step the graph records: the model's own ``step`` over the static caches, (rows,
        V) logits for ``tokens`` at ``pos``."""
        visible = (self._positions <= self.pos).view(1, 1, 1, -1)
        for layer_cache in self.caches:
            layer_cache.self_attn.visible = visible
        no_memory = self.tokens.new_empty(0)  # the cross caches are filled: memory is not read
        cache = DecoderCache(self.caches, index=self.pos)
        return self.model.step(self.tokens, no_memory, self.memory_mask, cache)[:, -1]

    def replay(self) -> Tensor:
        if self.tokens.device.type != "cuda":  # the same static step, run eagerly (tests)
            return self.forward()
        if self.graph is None:
            self._capture()
        assert self.graph is not None and self.logits is not None
        self.graph.replay()
        return self.logits

    def _capture(self) -> None:
        # Warm up on a side stream first (lazily made weights, cuBLAS's workspaces), as
        # torch.cuda.graphs asks; the writes at ``pos`` are overwritten by the real replay.
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            self.forward()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self.logits = self.forward()
        self.graph = graph

    def self_kv(self) -> list[tuple[Tensor, Tensor]]:
        out = []
        for cache in self.caches:
            assert isinstance(cache.self_attn, StaticKVCache)
            out.append(cache.self_attn.kv())
        return out

    def cross_kv(self) -> list[tuple[Tensor, Tensor]]:
        out = []
        for cache in self.caches:
            assert cache.cross_attn.k is not None and cache.cross_attn.v is not None
            out.append((cache.cross_attn.k, cache.cross_attn.v))
        return out


_TAKING = threading.Lock()  # the server decodes in several threads at once


def weights_signature(model: FastTransformer) -> tuple[tuple[int, int], ...]:
    """Where each parameter lives and how often it was written: a graph replays the addresses
    it was captured with, including packed copies that the fast path rebuilds when a weight
    changes (training between two validations), so a changed signature means a new capture."""
    return tuple((p.data_ptr(), p._version) for p in model.parameters())


def _kept(model: FastTransformer) -> OrderedDict[tuple[int, int, int], StepGraph]:
    kept = model.__dict__.get("_step_graphs")
    if kept is None:
        kept = model.__dict__["_step_graphs"] = OrderedDict()
    return kept


def _take(model: FastTransformer, rows: int, capacity: int, source: int) -> StepGraph:
    """A free graph of this shape from the model's kept ones, or a new one kept in their place."""
    with _TAKING:
        kept, key = _kept(model), (rows, capacity, source)
        weights = weights_signature(model)
        for stale in [k for k, graph in kept.items() if graph.weights != weights]:
            del kept[stale]  # a decoding still using one keeps it alive until it ends
        graph = kept.get(key)
        if graph is None or graph.busy:
            graph = StepGraph(model, rows, capacity, source)
            if key not in kept:
                kept[key] = graph
                while len(kept) > KEPT_GRAPHS:
                    kept.popitem(last=False)
        if key in kept:
            kept.move_to_end(key)
        graph.busy = True
        return graph


class GraphStepper:
    """The :class:`tformer.decoding.steppers.CachedStepper` interface, each step one graph
    replay. ``rows`` rows are real; the graph's further rows repeat row 0 and are dropped."""

    def __init__(self, model: FastTransformer, encoded: EncoderOutput) -> None:
        self.model = model
        self.rows = encoded.memory.size(0)
        self.length = 0  # positions written
        source = encoded.memory.size(1)
        self._source = -(-source // SOURCE_BUCKET) * SOURCE_BUCKET
        capacity = min(FIRST_CAPACITY, model.config.positions_held)
        self.graph = _take(model, _rows_bucket(self.rows), capacity, self._source)
        pad = self._padded(torch.arange(self.rows, device=encoded.memory.device))
        # The source's keys and values, projected once, eagerly, into the graph's caches.
        mask = encoded.mask.expand(-1, 1, 1, source).index_select(0, pad)
        self.graph.memory_mask.zero_()[..., :source].copy_(mask)
        memory = encoded.memory.index_select(0, pad)
        for layer, (k_static, v_static) in zip(_layers(model), self.graph.cross_kv(), strict=True):
            k, v = layer.cross_attn.project_kv(memory)
            k_static[:, :, :source].copy_(k)
            v_static[:, :, :source].copy_(v)

    def _padded(self, index: Tensor, rows: int | None = None) -> Tensor:
        """``index`` padded with its first row to ``rows`` (the graph's rows by default)."""
        rows = self.graph.rows if rows is None else rows
        if index.numel() == rows:
            return index
        return torch.cat([index, index[:1].expand(rows - index.numel())])

    def step(self, tokens: Tensor) -> Tensor:
        """(R,) newest tokens -> (R, V) float32 logits for the next one."""
        if self.length == self.graph.capacity:
            bigger = min(2 * self.graph.capacity, self.model.config.positions_held)
            self._move(self.graph.rows, bigger, torch.arange(self.graph.rows, device=tokens.device))
        graph = self.graph
        graph.tokens[: tokens.size(0), 0].copy_(tokens)
        graph.pos.fill_(self.length)
        logits = graph.replay()
        self.length += 1
        # A copy: the next replay writes the same buffer.
        return logits[: tokens.size(0)].to(torch.float32, copy=True)

    def reorder(self, index: Tensor, *, same_source: bool = False) -> None:
        """Keep rows ``index`` in that order (beams reordered, finished rows dropped)."""
        rows = _rows_bucket(index.numel())
        self.rows = index.numel()
        if rows != self.graph.rows:
            self._move(rows, self.graph.capacity, self._padded(index, rows))
            return
        pad = self._padded(index)
        parts = [kv for kv in self.graph.self_kv()]
        if not same_source:
            parts += self.graph.cross_kv()
            self.graph.memory_mask.copy_(self.graph.memory_mask.index_select(0, pad))
        for k, v in parts:
            k.copy_(k.index_select(0, pad))
            v.copy_(v.index_select(0, pad))

    def _move(self, rows: int, capacity: int, index: Tensor) -> None:
        """Carry the state (rows ``index`` of it) to the graph of a new shape."""
        old, new = self.graph, _take(self.model, rows, capacity, self._source)
        length = self.length
        for (k_old, v_old), (k_new, v_new) in zip(old.self_kv(), new.self_kv(), strict=True):
            k_new[:, :, :length].copy_(k_old[:, :, :length].index_select(0, index))
            v_new[:, :, :length].copy_(v_old[:, :, :length].index_select(0, index))
        for (k_old, v_old), (k_new, v_new) in zip(old.cross_kv(), new.cross_kv(), strict=True):
            k_new.copy_(k_old.index_select(0, index))
            v_new.copy_(v_old.index_select(0, index))
        new.memory_mask.copy_(old.memory_mask.index_select(0, index))
        old.busy = False
        self.graph = new

    def __del__(self) -> None:  # the decoding is over: the graph is free for the next
        graph = getattr(self, "graph", None)
        if graph is not None:
            graph.busy = False
