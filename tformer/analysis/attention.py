"""Attention maps with token labels, from the same forward pass that training uses.

Shape legend: L layers, H heads, S source tokens, T decoder positions (BOS + target),
R / C the rows / columns of one map (queries / keys).
Rows of decoder and cross maps are decoder *input* positions: row i is the position that
predicts target token i (row 0 reads BOS).

Three parts: ``inspect_attention`` runs the pass and returns an ``AttentionResult``;
``head_statistics`` summarises each head and names its dominant pattern (a pure function of
the maps); ``save_attention`` / ``load_attention`` write and read a selection of maps as JSON
or NumPy ``.npz`` (no pickle).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor

from tformer.checkpoint import Tokenizers
from tformer.data.tokenizer import BOS_ID, EOS, EOS_ID
from tformer.decoding.sampling import DecodingConfig, decode_texts
from tformer.errors import ConfigError, DataError
from tformer.model import Transformer

Kind = Literal["encoder", "decoder", "cross"]
KINDS: tuple[str, ...] = ("encoder", "decoder", "cross")
Layer = int | Literal["all"]
Head = int | Literal["all", "mean"]

FILE_FORMAT = "tformer-attention"
FILE_VERSION = 1


@dataclass(frozen=True)
class AttentionSelection:
    """Some of the maps of one (source, target) pair, labelled: what a file export holds.

    Attributes:
        weights: the maps; ``dims`` names their axes, e.g. ("row", "column") for one head of
            one layer, ("layer", "head", "row", "column") for every head of every layer.
        layer / head: what was selected: a number, "all", or for heads also "mean".
        rows / columns: the token labels of the last two axes.
        checkpoint: where the model came from (None when unknown).
    """

    kind: str
    layer: Layer
    head: Head
    dims: tuple[str, ...]
    weights: Tensor
    rows: list[str]
    columns: list[str]
    source: str
    target: str
    generated: bool
    checkpoint: str | None = None

    def metadata(self) -> dict[str, Any]:
        """Everything but the weights and labels, JSON-ready."""
        return {
            "format": FILE_FORMAT,
            "version": FILE_VERSION,
            "checkpoint": self.checkpoint,
            "source": self.source,
            "target": self.target,
            "target_generated": self.generated,
            "kind": self.kind,
            "layer": self.layer,
            "head": self.head,
            "dims": list(self.dims),
            "shape": list(self.weights.shape),
        }


@dataclass(frozen=True)
class AttentionResult:
    """Every attention map of one (source, target) pair.

    Attributes:
        encoder: (L, H, S, S) source self-attention.
        decoder: (L, H, T, T) causal self-attention over BOS + target.
        cross: (L, H, T, S) decoder positions over source tokens.
        source_tokens / target_tokens: labels for S and T, as the tokenizer writes them.
        target_text: the target the maps were computed for (given or generated).
    """

    encoder: Tensor
    decoder: Tensor
    cross: Tensor
    source_tokens: list[str]
    target_tokens: list[str]
    source_text: str
    target_text: str
    generated: bool

    def maps(self, kind: str) -> Tensor:
        if kind not in KINDS:
            raise ConfigError(f"--kind {kind!r} must be one of {', '.join(KINDS)}")
        return getattr(self, kind)

    def labels(self, kind: str) -> tuple[list[str], list[str]]:
        """(row labels, column labels) of a kind's maps."""
        if kind == "encoder":
            return self.source_tokens, self.source_tokens
        if kind == "decoder":
            return self.target_tokens, self.target_tokens
        return self.target_tokens, self.source_tokens

    def select(self, kind: str, layer: Layer, head: Head) -> Tensor:
        """The maps of ``layer`` (a number or "all") and ``head`` (a number, "all" or "mean").

        Negative numbers count from the end, as in Python. Returns (R, C) for one layer and
        one head or the mean, (H, R, C) for all heads of one layer, and (L, ...) for all layers.
        """
        maps = self.maps(kind)
        n_layers, n_heads = maps.shape[0], maps.shape[1]
        if layer != "all" and not _in_range(layer, n_layers):
            raise ConfigError(
                f"--layer {layer} is out of range: the {kind} attention has {n_layers} layers "
                f"(0..{n_layers - 1}, -1..-{n_layers}, or 'all')"
            )
        if head not in ("all", "mean") and not _in_range(head, n_heads):
            raise ConfigError(
                f"--head {head} is out of range: {n_heads} heads (0..{n_heads - 1}, "
                f"-1..-{n_heads}), 'all' or 'mean'"
            )
        chosen = maps if layer == "all" else maps[layer]  # (L, H, R, C) or (H, R, C)
        head_axis = 1 if layer == "all" else 0
        if head == "all":
            return chosen
        if head == "mean":
            return chosen.mean(dim=head_axis)
        return chosen.select(head_axis, head)

    def selection(
        self, kind: str, layer: Layer, head: Head, *, checkpoint: str | None = None
    ) -> AttentionSelection:
        """``select`` plus labels and provenance, with negative numbers made absolute."""
        weights = self.select(kind, layer, head)
        n_layers, n_heads = self.maps(kind).shape[:2]
        dims = (
            *(("layer",) if layer == "all" else ()),
            *(("head",) if head == "all" else ()),
            "row",
            "column",
        )
        rows, columns = self.labels(kind)
        return AttentionSelection(
            kind=kind,
            layer=layer if layer == "all" else layer % n_layers,
            head=head if isinstance(head, str) else head % n_heads,
            dims=dims,
            weights=weights.contiguous(),
            rows=list(rows),
            columns=list(columns),
            source=self.source_text,
            target=self.target_text,
            generated=self.generated,
            checkpoint=checkpoint,
        )


def _in_range(index: object, size: int) -> bool:
    return isinstance(index, int) and not isinstance(index, bool) and -size <= index < size


@torch.no_grad()
def inspect_attention(
    model: Transformer,
    tokenizers: Tokenizers,
    source: str,
    target: str | None = None,
    decoding: DecodingConfig | None = None,
) -> AttentionResult:
    """Attention maps for ``source`` with ``target`` teacher-forced, or the model's own output.

    The model runs in eval mode (no dropout) and is put back in the mode it was in.

    Args:
        target: the target text; None decodes one with ``decoding`` (greedy by default).
    """
    was_training = model.training
    model.eval()
    try:
        return _inspect(model, tokenizers, source, target, decoding)
    finally:
        model.train(was_training)


def _inspect(
    model: Transformer,
    tokenizers: Tokenizers,
    source: str,
    target: str | None,
    decoding: DecodingConfig | None,
) -> AttentionResult:
    device = next(model.parameters()).device
    src_ids = tokenizers.source.encode(source) or [EOS_ID]
    generated = target is None
    if target is None:
        hyp = decode_texts(model, [src_ids], decoding or DecodingConfig())[0][0]
        tgt_ids = hyp.ids
        target = tokenizers.target.decode(tgt_ids)
    else:
        tgt_ids = tokenizers.target.encode(target)
    limit = model.config.max_len
    src_ids, tgt_ids = src_ids[:limit], tgt_ids[: limit - 1]
    tgt_in = [BOS_ID, *tgt_ids]
    src = torch.tensor([src_ids], device=device)
    out = model(src, torch.tensor([tgt_in], device=device), need_weights=True)
    assert out.attentions is not None

    def stack(maps: list[Tensor]) -> Tensor:
        return torch.stack([m[0] for m in maps]).float().cpu()  # (L, H, R, C)

    return AttentionResult(
        encoder=stack(out.attentions.encoder),
        decoder=stack(out.attentions.decoder),
        cross=stack(out.attentions.cross),
        source_tokens=tokenizers.source.tokens(src_ids),
        target_tokens=tokenizers.target.tokens(tgt_in),
        source_text=source,
        target_text=target,
        generated=generated,
    )


# -- head statistics --------------------------------------------------------------------------

# A head is named for a positional pattern when at least this share of its weight follows it.
POSITIONAL_SHARE = 0.5
# ... "broad" when its rows spread this evenly (entropy / log(keys it can see)) ...
BROAD_ENTROPY = 0.75
# ... and "focused" (content-based: sharp, but not at a fixed offset) when rows peak this high.
FOCUSED_PEAK = 0.5
PATTERNS = ("diagonal", "previous-token", "first-token", "eos", "broad", "focused", "mixed")


@dataclass(frozen=True)
class HeadStats:
    """How one head spreads its weight, averaged over the rows (queries) of its map.

    Shares are the mean weight a row puts on that key: ``diagonal`` its own position,
    ``previous`` the one before, ``first`` key 0 (an "attention sink"), ``eos`` the
    end-of-sequence key. ``entropy`` is in nats; ``spread`` is entropy / log(keys the row can
    see), 0 for one-hot rows and 1 for uniform ones; ``max_weight`` is a row's largest weight.
    """

    layer: int
    head: int
    entropy: float
    spread: float
    diagonal: float
    previous: float
    first: float
    eos: float
    max_weight: float
    pattern: str


def eos_column(columns: list[str]) -> int:
    """The end-of-sequence key: the last ``<eos>`` column if there is one, else the last one."""
    found = [i for i, token in enumerate(columns) if token == EOS]
    return found[-1] if found else len(columns) - 1


def head_statistics(
    maps: Tensor, *, causal: bool = False, eos: int | None = None
) -> list[HeadStats]:
    """Statistics and a pattern tag for every head of (L, H, R, C) maps.

    Args:
        causal: row i sees keys 0..i only (decoder self-attention). Rows that can see a single
            key have no choice to make and are left out of the averages.
        eos: the end-of-sequence column (default: the last one).

    Returns:
        One ``HeadStats`` per (layer, head), layer-major.
    """
    n_layers, n_heads, n_rows, n_cols = maps.shape
    maps = maps.double()
    row = torch.arange(n_rows)
    r, c = row[:, None], torch.arange(n_cols)[None, :]
    visible = c <= r if causal else torch.ones(n_rows, n_cols, dtype=torch.bool)
    n_keys = visible.sum(-1)  # (R,)
    used = n_keys > 1
    if not used.any():
        used = torch.ones(n_rows, dtype=torch.bool)
    eos = n_cols - 1 if eos is None else eos

    def share(keys: Tensor, valid: Tensor) -> Tensor:  # (L, H): mean weight on ``keys``
        valid = valid & used
        if not valid.any():
            return maps.new_zeros(n_layers, n_heads)
        return (maps * keys).sum(-1)[..., valid].mean(-1)

    entropy = -torch.special.xlogy(maps, maps).sum(-1)  # (L, H, R)
    log_keys = n_keys.double().clamp(min=2).log()
    spread = torch.where(n_keys > 1, entropy / log_keys, torch.zeros_like(entropy))
    measures = {
        "diagonal": share(c == r, row < n_cols),
        "previous": share(c == r - 1, (row >= 1) & (row - 1 < n_cols)),
        "first": share(c == 0, used),
        "eos": share(c == eos, visible[:, eos]),
        "entropy": entropy[..., used].mean(-1),
        "spread": spread[..., used].mean(-1),
        "max_weight": maps.amax(-1)[..., used].mean(-1),
    }
    stats = []
    for layer in range(n_layers):
        for head in range(n_heads):
            values = {name: float(v[layer, head]) for name, v in measures.items()}
            stats.append(
                HeadStats(layer=layer, head=head, pattern=head_pattern(**values), **values)
            )
    return stats


def head_pattern(
    *,
    diagonal: float,
    previous: float,
    first: float,
    eos: float,
    spread: float,
    max_weight: float,
    **_: float,
) -> str:
    """The dominant pattern of a head from its statistics (one of ``PATTERNS``)."""
    positional = {
        "diagonal": diagonal,
        "previous-token": previous,
        "first-token": first,
        "eos": eos,
    }
    name, best = max(positional.items(), key=lambda item: item[1])
    if best >= POSITIONAL_SHARE:
        return name
    if spread >= BROAD_ENTROPY:
        return "broad"
    if max_weight >= FOCUSED_PEAK:
        return "focused"
    return "mixed"


# -- files: JSON and NPZ ----------------------------------------------------------------------


def save_attention(path: Path, selection: AttentionSelection) -> None:
    """Write ``selection`` as ``.json`` (one object) or ``.npz`` (arrays, loadable without pickle).

    Raises:
        ConfigError: another file type.
    """
    suffix = path.suffix.lower()
    meta = selection.metadata()
    path.parent.mkdir(parents=True, exist_ok=True)
    if suffix == ".json":
        record = {
            **meta,
            "rows": selection.rows,
            "columns": selection.columns,
            "weights": selection.weights.tolist(),
        }
        path.write_text(json.dumps(record, ensure_ascii=False) + "\n", encoding="utf-8")
    elif suffix == ".npz":
        with open(path, "wb") as handle:  # a file object: numpy would append .npz to a name
            np.savez(
                handle,
                weights=selection.weights.detach().cpu().numpy().astype(np.float32),
                rows=np.array(selection.rows, dtype=np.str_),
                columns=np.array(selection.columns, dtype=np.str_),
                meta=np.array([json.dumps(meta, ensure_ascii=False)], dtype=np.str_),
            )
    else:
        raise ConfigError(f"--save {path}: {suffix or 'no suffix'} is not .json or .npz")


def load_attention(path: Path) -> AttentionSelection:
    """Read a file written by ``save_attention`` (``.json`` or ``.npz``).

    Raises:
        DataError: a missing, unreadable or foreign file.
    """
    path = Path(path)
    try:
        if path.suffix.lower() == ".npz":
            with np.load(path, allow_pickle=False) as arrays:
                meta = json.loads(str(arrays["meta"][0]))
                _check_format(path, meta)
                rows = [str(t) for t in arrays["rows"]]
                columns = [str(t) for t in arrays["columns"]]
                weights = torch.from_numpy(arrays["weights"].copy())
        else:
            meta = json.loads(path.read_text(encoding="utf-8"))
            _check_format(path, meta)
            rows, columns = list(meta["rows"]), list(meta["columns"])
            weights = torch.tensor(meta["weights"], dtype=torch.float32)
        return AttentionSelection(
            kind=meta["kind"],
            layer=meta["layer"],
            head=meta["head"],
            dims=tuple(meta["dims"]),
            weights=weights.reshape(meta["shape"]),
            rows=rows,
            columns=columns,
            source=meta["source"],
            target=meta["target"],
            generated=meta["target_generated"],
            checkpoint=meta["checkpoint"],
        )
    except (OSError, ValueError, KeyError, IndexError, TypeError, RuntimeError) as error:
        raise DataError(f"{path}: cannot read attention maps ({error})") from error


def _check_format(path: Path, meta: Any) -> None:
    if not isinstance(meta, dict) or (meta.get("format"), meta.get("version")) != (
        FILE_FORMAT,
        FILE_VERSION,
    ):
        raise DataError(f"{path}: not a {FILE_FORMAT} file, version {FILE_VERSION}")
