"""A Hugging Face ``MarianMTModel`` folder (OPUS-MT) as a tformer model and tokenizers.

The reverse of ``tformer.export.huggingface``: Marian is tformer's post-norm Transformer with
embeddings scaled by √d_model and sinusoidal positions laid out [sin..., cos...], so every
d_model axis is permuted back to tformer's interleaved layout (``marian_feature_order``), and
every vocabulary axis (embedding rows, output rows, ``final_logits_bias``) is put in tformer's
id order: ``<pad> <bos> <eos> <unk>`` first (``tformer.data.spm``). Marian starts
decoding from its ``<pad>``, which becomes tformer's ``<bos>``; tformer's ``<pad>`` is then a
new row (zeros). What Marian has and the paper does not are variants: SiLU ("swish"), the
logits bias (``output_bias``) and the ``</s>`` closing every source (``source_eos``).

Marian configurations tformer cannot express (pre-norm, unscaled embeddings, a layer norm on
the embeddings, different encoder and decoder widths) are refused before anything is written.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from tformer.checkpoint.store import Tokenizers
from tformer.config import BOS_ID, EOS, EOS_ID, PAD_ID, ModelConfig
from tformer.data.tokenizer import Tokenizer
from tformer.errors import CheckpointError, ConfigError
from tformer.export.huggingface import TARGET_TOKENIZER, marian_feature_order
from tformer.model import Transformer, TransformerBase, build_model
from tformer.paths import excerpt_list, first_line

INSTALL = 'pip install "tformer[import]"'
CONFIG, WEIGHTS, PICKLED = "config.json", "model.safetensors", "pytorch_model.bin"
FAST_TOKENIZER, TOKENIZER_CONFIG = "tokenizer.json", "tokenizer_config.json"
MARIAN_TOKENIZER_FILES = ("source.spm", "target.spm", "vocab.json")
# Marian's activation names -> tformer's (transformers' ACT2FN: "swish" and "silu" are SiLU).
ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "swish": "silu", "silu": "silu"}
# The logit bias of a row that must never win: exp(-1e4) is 0 in float32, bf16 and fp16 alike,
# yet it stays finite, so label smoothing's sum over the vocabulary stays finite too.
NEVER = -1e4


@dataclass
class Imported:
    """What an import produces: the model (eval mode), its tokenizers, and where it came from."""

    model: TransformerBase
    tokenizers: Tokenizers
    origin: dict[str, Any]


def transformers_config(folder: Path, name: str, raw: dict[str, Any] | None = None) -> Any:
    """``transformers.<name>`` (e.g. "GPT2Config") read from the folder's config.json (or
    ``raw``, when the caller already read it).

    Raises:
        ConfigError: transformers is not installed.
    """
    try:
        import transformers
    except ImportError as error:
        raise ConfigError(f"tformer import needs transformers; {INSTALL}") from error
    return getattr(transformers, name).from_dict(
        raw if raw is not None else read_json(folder / CONFIG)
    )


def read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as error:
        raise CheckpointError(
            f"{path}: missing; a folder written by save_pretrained has it"
        ) from error
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CheckpointError(f"{path}: unreadable ({first_line(error)})") from error
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: not a JSON object")
    return data


def marian_config(folder: Path) -> Any:
    """The folder's ``MarianConfig`` (transformers' defaults for keys it leaves out).

    Raises:
        CheckpointError: config.json is missing or unreadable, or names another model type.
        ConfigError: transformers is not installed.
    """
    raw = read_json(folder / CONFIG)
    model_type = raw.get("model_type")
    if model_type != "marian":
        raise CheckpointError(
            f"{folder / CONFIG}: model_type {model_type!r} is not a Marian model; tformer "
            "import reads MarianMTModel (OPUS-MT) folders only"
        )
    try:
        from transformers import MarianConfig
    except ImportError as error:
        raise ConfigError(f"tformer import needs transformers; {INSTALL}") from error
    return MarianConfig.from_dict(raw)


def check_expressible(config: Any, where: Path) -> None:
    """Refuse, naming each one, the Marian settings tformer's model cannot express.

    Raises:
        CheckpointError: naming every such setting in one line.
    """
    problems = []
    if getattr(config, "normalize_before", False):
        problems.append("normalize_before (pre-norm layers)")
    if not getattr(config, "scale_embedding", False):
        problems.append("scale_embedding false (tformer scales embeddings by sqrt(d_model))")
    for name in ("normalize_embedding", "layernorm_embedding", "add_final_layer_norm"):
        if getattr(config, name, False):
            problems.append(f"{name} (a layer norm tformer's post-norm model has not)")
    if config.activation_function not in ACTIVATIONS:
        problems.append(f"activation_function {config.activation_function!r}")
    for mine, theirs in (
        ("encoder_attention_heads", "decoder_attention_heads"),
        ("encoder_ffn_dim", "decoder_ffn_dim"),
    ):
        if getattr(config, mine) != getattr(config, theirs):
            problems.append(f"{mine} != {theirs}")
    if config.d_model % 2 or config.d_model % config.encoder_attention_heads:
        problems.append(f"d_model {config.d_model} (must be even and divide into the heads)")
    if problems:
        raise CheckpointError(
            f"{where / CONFIG}: {'; '.join(problems)}: tformer has no equivalent, so this "
            "model cannot be imported"
        )


@contextmanager
def open_weights(folder: Path) -> Iterator[_Tensors]:
    """``model.safetensors`` opened for reading one tensor at a time (so an import holds the
    model and one tensor in memory, not the file's tensors as well).

    Raises:
        CheckpointError: the file is missing (a pickled ``pytorch_model.bin`` is not read)
            or unreadable.
    """
    path = folder / WEIGHTS
    if not path.is_file():
        why = f"{PICKLED} is a pickle, which" if (folder / PICKLED).exists() else "a pickle"
        raise CheckpointError(
            f"{path}: missing; {why} tformer does not load: load the model with transformers, "
            "save it with save_pretrained (safetensors, the default) and import that folder"
        )
    try:
        with safe_open(str(path), framework="pt") as handle:
            yield _Tensors(_OneMapEach(handle, path), path)
    except (SafetensorError, OSError) as error:
        raise CheckpointError(f"{path}: unreadable ({first_line(error)})") from error


class _OneMapEach:
    """A ``safe_open`` handle whose tensors each come from a map of their own, unmapped when
    the tensor is let go: the pages a map has read stay resident while it is open, so reading
    every tensor through the one map kept the whole file in memory beside the model being
    built. (A write to such a tensor goes to a private copy, never to the file.)"""

    def __init__(self, handle: Any, path: Path) -> None:
        self.handle, self.path = handle, path

    def keys(self) -> Any:
        return self.handle.keys()

    def get_slice(self, key: str) -> Any:
        return self.handle.get_slice(key)  # shapes only: no data page is read

    def get_tensor(self, key: str) -> torch.Tensor:
        with safe_open(str(self.path), framework="pt") as handle:
            tensor: torch.Tensor = handle.get_tensor(key)  # keeps its map open while alive
        return tensor


class _Tensors:
    """The Marian tensors, read one at a time (float32) with their expected shapes checked."""

    def __init__(self, handle: Any, path: Path) -> None:
        self.handle = handle
        self.left = set(handle.keys())
        self.used: set[str] = set()
        self.path = path

    def take(self, name: str, shape: tuple[int, ...], *fallbacks: str) -> torch.Tensor:
        """The tensor ``name`` (or the first of ``fallbacks`` present: a tied one saved once)."""
        key = next((k for k in (name, *fallbacks) if k in self.left), None)
        if key is None:
            raise CheckpointError(
                f"{self.path}: has no tensor {name}; the weights do not match config.json"
            )
        self.used.add(key)
        found = tuple(self.handle.get_slice(key).get_shape())
        if found != shape:
            raise CheckpointError(
                f"{self.path}: {key} has shape {found} but config.json makes it "
                f"{shape}; the weights do not match their config"
            )
        return self.handle.get_tensor(key).float()

    def done(self, tied: set[str]) -> None:
        """Refuse tensors left over: neither read, nor a copy of a tied matrix (``tied``),
        nor Marian's sinusoid table (a function of the config, not weights)."""
        left = sorted(
            key
            for key in self.left - self.used - tied
            if not key.endswith("embed_positions.weight")
        )
        if left:
            raise CheckpointError(
                f"{self.path}: tensors {excerpt_list(left)} have no place in a Marian model of "
                "its config.json (a variant tformer cannot express)"
            )


def _layer_state(
    weights: _Tensors, config: Any, inverse: torch.Tensor, side: str, i: int
) -> dict[str, torch.Tensor]:
    """tformer's weights of one encoder or decoder layer, d_model axes back in its order."""
    d, f = config.d_model, config.encoder_ffn_dim
    theirs, ours = f"model.{side}.layers.{i}", f"{side}.layers.{i}"
    state: dict[str, torch.Tensor] = {}

    def reads(name: str, out: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        weight = weights.take(f"{theirs}.{name}.weight", (out, width))
        bias = weights.take(f"{theirs}.{name}.bias", (out,))
        return (weight[:, inverse] if width == d else weight), bias

    def writes(name: str, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        weight = weights.take(f"{theirs}.{name}.weight", (d, width) if width else (d,))
        bias = weights.take(f"{theirs}.{name}.bias", (d,))
        return weight[inverse], bias[inverse]

    attentions = [("self_attn", "self_attn")]
    if side == "decoder":
        attentions.append(("encoder_attn", "cross_attn"))
    for name, mine in attentions:
        q, q_b = reads(f"{name}.q_proj", d, d)
        k, k_b = reads(f"{name}.k_proj", d, d)
        v, v_b = reads(f"{name}.v_proj", d, d)
        o, o_b = writes(f"{name}.out_proj", d)
        state.update({
            f"{ours}.{mine}.q_proj.weight": q, f"{ours}.{mine}.q_proj.bias": q_b,
            f"{ours}.{mine}.kv_proj.weight": torch.cat([k, v]),
            f"{ours}.{mine}.kv_proj.bias": torch.cat([k_b, v_b]),
            f"{ours}.{mine}.out_proj.weight": o, f"{ours}.{mine}.out_proj.bias": o_b,
        })  # fmt: skip
    norms = {"self_attn_layer_norm": "norm1", "final_layer_norm": "norm2"}
    if side == "decoder":
        norms = {**norms, "encoder_attn_layer_norm": "norm2", "final_layer_norm": "norm3"}
    for name, mine in norms.items():
        state[f"{ours}.{mine}.weight"], state[f"{ours}.{mine}.bias"] = writes(name, 0)
    w1, b1 = reads("fc1", f, d)
    w2, b2 = writes("fc2", f)
    state.update({
        f"{ours}.feed_forward.w1.weight": w1, f"{ours}.feed_forward.w1.bias": b1,
        f"{ours}.feed_forward.w2.weight": w2, f"{ours}.feed_forward.w2.bias": b2,
    })  # fmt: skip
    return state


def rows_in_order(matrix: torch.Tensor, order: list[int | None]) -> torch.Tensor:
    """``matrix``'s rows (a foreign vocabulary's) in tformer's id order; a new row is zeros."""
    out = matrix.new_empty(len(order), *matrix.shape[1:])
    fill_rows_in_order(out, matrix, order)
    return out


def fill_rows_in_order(
    dest: torch.Tensor,
    matrix: torch.Tensor,
    order: list[int | None],
    columns: torch.Tensor | None = None,
    block: int = 4096,
) -> None:
    """``dest`` = ``matrix``'s rows in tformer's id order (new rows zeros), and with
    ``columns`` its columns in that order too; a block of rows at a time, so no temporary of
    the matrix's size is made."""
    index = torch.tensor([0 if i is None else i for i in order])
    for start in range(0, len(order), block):
        rows = index[start : start + block]
        part = matrix[rows] if columns is None else matrix[rows[:, None], columns[None, :]]
        dest[start : start + block].copy_(part)
    dest[[row for row, i in enumerate(order) if i is None]] = 0.0


def never_rows(order: list[int | None]) -> list[int]:
    """Rows tformer must never predict: new rows, and repeats of an earlier foreign id (a
    piece a SentencePiece model produces that the vocabulary lacks, standing for <unk>)."""
    seen: set[int] = set()
    rows = []
    for row, i in enumerate(order):
        if i is None or i in seen:
            rows.append(row)
        else:
            seen.add(i)
    return rows


def logits_bias(bias: torch.Tensor, order: list[int | None]) -> torch.Tensor | None:
    """tformer's logits bias from Marian's ``final_logits_bias`` (its vocabulary order), or
    None when it would hold nothing: <pad> and <bos> (never predicted; an export writes -inf
    there) and rows that stand for no Marian token get :data:`NEVER`."""
    ours = rows_in_order(bias[:, None], order)[:, 0]
    never = never_rows(order)
    ours[never] = NEVER
    ours[[PAD_ID, BOS_ID]] = NEVER
    ours[torch.isinf(ours)] = NEVER
    if not never and not ours[BOS_ID + 1 :].any():
        return None
    return ours


def model_config(
    config: Any, src_size: int, tgt_size: int, *, share: bool, output_bias: bool, source_eos: bool
) -> ModelConfig:
    """tformer's architecture of a (checked) Marian config."""
    return ModelConfig(
        src_vocab_size=src_size,
        tgt_vocab_size=tgt_size,
        d_model=config.d_model,
        n_heads=config.encoder_attention_heads,
        n_encoder_layers=config.encoder_layers,
        n_decoder_layers=config.decoder_layers,
        d_ff=config.encoder_ffn_dim,
        dropout=config.dropout,
        attention_dropout=config.attention_dropout,
        norm="post",
        activation=ACTIVATIONS[config.activation_function],  # type: ignore[arg-type]
        max_len=config.max_position_embeddings,
        tie_embeddings=bool(config.tie_word_embeddings),
        share_embeddings=share,
        output_bias=output_bias,
        source_eos=source_eos,
    )


@dataclass
class FolderTokenizers:
    """A folder's tokenizers, the id orders onto the Marian vocabularies, and whether the
    model reads its sources closed by </s>."""

    tokenizers: Tokenizers
    source_order: list[int | None]
    target_order: list[int | None]
    source_eos: bool
    kind: str  # "MarianTokenizer" or "PreTrainedTokenizerFast" (a tformer export)


def folder_tokenizers(folder: Path, config: Any) -> FolderTokenizers:
    """The tokenizers of a ``save_pretrained`` folder: Marian's SentencePiece files, or the
    fast tokenizer(s) ``tformer export --to huggingface`` writes.

    Raises:
        CheckpointError: tokenizer files are missing or do not fit the model's special ids.
    """
    if (folder / FAST_TOKENIZER).is_file() and not (folder / "source.spm").exists():
        return _exported_tokenizers(folder, config)
    missing = [name for name in MARIAN_TOKENIZER_FILES if not (folder / name).is_file()]
    if missing:
        raise CheckpointError(
            f"{folder}: tokenizer files {', '.join(missing)} are missing; save the "
            "MarianTokenizer into the folder too (tokenizer.save_pretrained)"
        )
    from tformer.data.spm import marian_tokenizers

    found = marian_tokenizers(
        folder,
        pad_id=config.pad_token_id,
        eos_id=config.eos_token_id,
        decoder_start_id=config.decoder_start_token_id,
    )
    source, target = found.source, found.target
    if found.joint and source.to_str() == target.to_str():
        target = source  # one SentencePiece model for both sides: one tokenizer file
    return FolderTokenizers(
        Tokenizers(source, target),
        found.source_order,
        found.target_order,
        source_eos=True,  # MarianTokenizer closes every source with </s>
        kind="MarianTokenizer",
    )


def _exported_tokenizers(folder: Path, config: Any) -> FolderTokenizers:
    """The fast tokenizer(s) of a folder tformer exported: special ids 0..3 already, so the
    orders are the identity, and </s> closes sources where its post-processor appends it."""
    from tformer.data.spm import special_first_order

    def load(path: Path) -> tuple[Tokenizer, bool]:
        text = path.read_text(encoding="utf-8")
        processor = json.loads(text).get("post_processor") or {}
        appends = EOS in json.dumps(processor.get("single", []))
        return Tokenizer.from_str(text, source=str(path)), appends

    source, source_eos = load(folder / FAST_TOKENIZER)
    target_file = folder / TARGET_TOKENIZER / FAST_TOKENIZER
    target = load(target_file)[0] if target_file.is_file() else source
    if config.decoder_start_token_id != BOS_ID or config.eos_token_id != EOS_ID:
        raise CheckpointError(
            f"{folder / CONFIG}: decoder_start_token_id {config.decoder_start_token_id} / "
            f"eos_token_id {config.eos_token_id} do not fit its tokenizer ({BOS_ID} / {EOS_ID})"
        )

    def order(tokenizer: Tokenizer) -> list[int | None]:
        return special_first_order(tokenizer.vocab_size, pad=0, bos=1, eos=2, unk=3)

    return FolderTokenizers(
        Tokenizers(source, target),
        order(source),
        order(target),
        source_eos=source_eos,
        kind="PreTrainedTokenizerFast",
    )


def read_marian(folder: Path, *, source: str) -> Imported:
    """Read a ``save_pretrained`` MarianMTModel folder as a tformer model and tokenizers.

    Args:
        folder: the local folder (config.json, model.safetensors, tokenizer files).
        source: what the user named (a hub id or the folder), recorded as the origin.

    Raises:
        CheckpointError: another model type, a Marian variant tformer cannot express, missing
            tokenizer files, or weights that do not match their config.
        ConfigError: the optional packages are not installed.
    """
    config = marian_config(folder)
    check_expressible(config, folder)
    found = folder_tokenizers(folder, config)
    tokenizers = found.tokenizers
    with open_weights(folder) as weights:
        layout = _layout(weights, config, found)
        arch = model_config(
            config,
            tokenizers.source.vocab_size,
            tokenizers.target.vocab_size,
            share=layout.share,
            output_bias=layout.bias is not None,
            source_eos=found.source_eos,
        )
        model = Transformer(arch)
        # Each converted tensor goes straight into the model, so at most one is held beside it.
        target = model.state_dict()
        filled = set()
        for name, tensor in _converted(weights, config, found, layout):
            if callable(tensor):
                tensor(target[name])
            else:
                target[name].copy_(tensor)
            filled.add(name)
        assert filled == set(target), set(target) ^ filled
        weights.done(_tied_names(config))
    return Imported(model.eval(), tokenizers, origin_of(source, folder, config, found.kind))


def origin_of(source: str, folder: Path, config: Any, tokenizer: str) -> dict[str, Any]:
    """What config.json records of where imported weights came from."""
    return {
        "source": source,
        "folder": str(folder.resolve()),
        "model_type": config.model_type,
        "transformers_version": getattr(config, "transformers_version", None),
        "tokenizer": tokenizer,
    }


def one_tokenizer_import(
    arch: ModelConfig, state: dict[str, torch.Tensor], tokenizer: Tokenizer, origin: dict[str, Any]
) -> Imported:
    """A model of ``arch`` holding ``state`` whose two sides read one tokenizer (GPT-2, BERT,
    T5)."""
    model = build_model(arch)
    model.load_state_dict(state, strict=True)
    return Imported(model.eval(), Tokenizers(tokenizer, tokenizer), origin)


def _tied_names(config: Any) -> set[str]:
    """The names a tied matrix may also be saved under, read once through another."""
    names = {"model.decoder.embed_tokens.weight"}
    if config.share_encoder_decoder_embeddings:
        names |= {"model.shared.weight", "model.encoder.embed_tokens.weight"}
    if config.tie_word_embeddings:
        names.add("lm_head.weight")
    return names


@dataclass
class _Layout:
    """What the conversion needs to know before the model is built."""

    src_size: int  # Marian's source and target vocabulary sizes
    tgt_size: int
    share: bool  # one embedding matrix for both sides
    bias: torch.Tensor | None  # tformer's logits bias, None when it would hold nothing
    inverse: torch.Tensor  # tformer's d_model order from Marian's


def _layout(weights: _Tensors, config: Any, found: FolderTokenizers) -> _Layout:
    """Sizes checked against the tokenizers, whether the embeddings are one, the bias."""
    share = bool(config.share_encoder_decoder_embeddings)
    src_size = config.vocab_size
    tgt_size = src_size if share else (config.decoder_vocab_size or src_size)
    for name, order, size in (
        ("source", found.source_order, src_size),
        ("target", found.target_order, tgt_size),
    ):
        rows = {i for i in order if i is not None}
        if rows and (max(rows) >= size or len(rows) != size):
            raise CheckpointError(
                f"{weights.path}: the {name} vocabulary has {len(rows)} tokens but the "
                f"embeddings {size} rows; the tokenizer does not belong to this model"
            )
    if share and found.source_order != found.target_order:
        raise CheckpointError(
            f"{weights.path.parent / CONFIG}: share_encoder_decoder_embeddings needs one "
            "vocabulary, but the tokenizer has separate ones"
        )
    layout = _Layout(
        src_size, tgt_size, share, None, torch.argsort(marian_feature_order(config.d_model))
    )
    if share:  # untied, transformers shares nothing: a fine-tuned copy may hold two embeddings
        encoder, decoder = _embeddings(weights, config, layout)
        layout.share = torch.equal(encoder, decoder)
    if "final_logits_bias" in weights.left:
        final = weights.take("final_logits_bias", (1, tgt_size))[0]
    else:
        final = torch.zeros(tgt_size)
    layout.bias = logits_bias(final, found.target_order)
    return layout


def _embeddings(
    weights: _Tensors, config: Any, layout: _Layout
) -> tuple[torch.Tensor, torch.Tensor]:
    """Marian's source and target embeddings (transformers saves a tied matrix once, under
    one of its names)."""
    return _embedding(weights, config, layout, "encoder"), _embedding(
        weights, config, layout, "decoder"
    )


def _embedding(weights: _Tensors, config: Any, layout: _Layout, side: str) -> torch.Tensor:
    """Marian's ``side`` ("encoder" or "decoder") embedding, under whichever name it is saved."""
    share = bool(config.share_encoder_decoder_embeddings)
    shared = ("model.shared.weight",) if share else ()
    head = (
        ("lm_head.weight",) if config.tie_word_embeddings and (share or side == "decoder") else ()
    )
    rows = layout.src_size if side == "encoder" else layout.tgt_size
    return weights.take(f"model.{side}.embed_tokens.weight", (rows, config.d_model), *shared, *head)


Fill = Callable[[torch.Tensor], None]  # writes a converted tensor into the model's


def _converted(
    weights: _Tensors, config: Any, found: FolderTokenizers, layout: _Layout
) -> Iterator[tuple[str, torch.Tensor | Fill]]:
    """tformer's state dict, one tensor at a time, from the Marian tensors."""
    inverse = layout.inverse

    def vocab(matrix: torch.Tensor, order: list[int | None]) -> Fill:
        # The vocabulary matrices are the largest tensors: written into the model a block of
        # rows at a time, with no converted copy beside the one read.
        return lambda dest: fill_rows_in_order(dest, matrix, order, inverse)

    names = ("encoder.embedding.embedding.weight", "decoder.embedding.embedding.weight")
    if layout.share:  # one matrix, read once
        shared = vocab(_embedding(weights, config, layout, "encoder"), found.source_order)
        for name in names:
            yield name, shared
        del shared
    else:
        for name, side, order in zip(
            names, ("encoder", "decoder"), (found.source_order, found.target_order), strict=True
        ):
            yield name, vocab(_embedding(weights, config, layout, side), order)
    if not config.tie_word_embeddings:
        head = weights.take("lm_head.weight", (layout.tgt_size, config.d_model))
        yield "output_projection.weight", vocab(head, found.target_order)
    if layout.bias is not None:
        yield "logits_bias", layout.bias
    for side, count in (("encoder", config.encoder_layers), ("decoder", config.decoder_layers)):
        for i in range(count):
            yield from _layer_state(weights, config, inverse, side, i).items()
