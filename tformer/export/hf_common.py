"""What the Hugging Face exports of every family share: the exported vocabulary (which of
tformer's rows, in which order, under which names) and its fast tokenizer, the generation
settings, the refusal, the README, and the folds that carry a tformer variant exactly into
weights the target has (an embedding scale, a sinusoidal table, a rescaled output).

A target family whose vocabulary is not tformer's (GPT-2 has one <|endoftext|>, T5 no <bos>)
exports a subset of tformer's rows in an order of its own: ``Vocabulary.rows`` names the
tformer row of every exported id, and the tokenizer is tformer's own pipeline with its ids
renumbered to match, so token ids and embedding rows always agree.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer as RustTokenizer
from tokenizers.processors import TemplateProcessing

from tformer.config import ModelConfig
from tformer.data.tokenizer import Tokenizer
from tformer.errors import ConfigError
from tformer.model.transformer import Decoder, Encoder, TransformerBase
from tformer.paths import json_loads

README = "README.md"
DEFAULTS = {f.name: f.default for f in fields(ModelConfig)}
TOKENIZER_CONFIG = "tokenizer_config.json"


@dataclass(frozen=True)
class Vocabulary:
    """The exported vocabulary: the tformer row of each exported id, the exported name of the
    tokens it renames, the tokenizer's special-token roles (``"eos_token"`` -> tformer id),
    and the tformer ids the tokenizer puts before / after every text."""

    rows: list[int]
    names: dict[int, str] = field(default_factory=dict)
    roles: dict[str, int] = field(default_factory=dict)
    prefix: tuple[int, ...] = ()
    suffix: tuple[int, ...] = ()

    def id(self, tformer_id: int) -> int:
        """The exported id of tformer's ``tformer_id``."""
        return self.rows.index(tformer_id)

    def take(self, matrix: torch.Tensor) -> torch.Tensor:
        """``matrix``'s rows (one per tformer id) in the exported order."""
        return matrix[self.rows].contiguous()


def refuse(model_name: str, found: Sequence[str], why: str) -> None:
    """Refuse in one line, naming every option ``found`` that ``model_name`` cannot express.

    Raises:
        ConfigError: when ``found`` is not empty.
    """
    if found:
        raise ConfigError(
            f"--to huggingface: the checkpoint was trained with {', '.join(found)}, which "
            f"{model_name} cannot express ({why}); use tformer's own decoding for it"
        )


def unsupported(config: ModelConfig, *, allowed: dict[str, Sequence[Any]]) -> list[str]:
    """The flags of ``config``'s architecture options outside ``allowed`` (field -> the
    values the target expresses), in the order of ``allowed``. ``"kv_heads": ()`` stands for
    multi-head attention only (no grouped key/value heads)."""
    found = []
    for name, values in allowed.items():
        if name == "kv_heads":
            if config.n_kv_heads != config.n_heads:
                found.append(f"--kv-heads {config.n_kv_heads}")
            continue
        value = getattr(config, name)
        if value in values:
            continue
        option = "--" + name.replace("_", "-")
        if not isinstance(value, bool):
            found.append(f"{option} {value}")
        elif value:
            found.append(option)
        else:  # the paper's default turned off (--no-...), or a variant left out
            found.append(f"--no-{option[2:]}" if DEFAULTS[name] else f"no {option}")
    return found


# -- tokenizer --------------------------------------------------------------------------------


def exported_tokenizer(
    tokenizer: Tokenizer, vocab: Vocabulary, max_len: int, *, input_names: Sequence[str]
) -> Any:
    """A ``PreTrainedTokenizerFast`` of tformer's ``tokenizer`` with its ids renumbered to
    ``vocab.rows`` (rows left out are gone), its specials renamed by ``vocab.names`` and set as
    ``vocab.roles``, and a post-processor framing every text with ``vocab.prefix`` /
    ``vocab.suffix``.

    Raises:
        ConfigError: two exported tokens would have one name.
    """
    from transformers import PreTrainedTokenizerFast

    data = json_loads(tokenizer.to_str())
    model = data["model"]
    unigram = model["type"] == "Unigram"
    if unigram:
        pieces = {i: entry[0] for i, entry in enumerate(model["vocab"])}
        scores = {i: entry[1] for i, entry in enumerate(model["vocab"])}
    else:
        pieces = {i: piece for piece, i in model["vocab"].items()}
    added = data.get("added_tokens") or []
    pieces.update({token["id"]: token["content"] for token in added})
    names = [vocab.names.get(i, pieces[i]) for i in vocab.rows]
    if len(set(names)) != len(names):
        clash = next(n for n in names if names.count(n) > 1)
        raise ConfigError(
            f"--to huggingface: the tokenizer has an ordinary piece {clash!r}, the name the "
            "export gives a special token; this tokenizer cannot be exported"
        )
    new = {old: i for i, old in enumerate(vocab.rows)}
    if unigram:
        model["vocab"] = [
            [name, scores.get(old, 0.0)] for name, old in zip(names, vocab.rows, strict=True)
        ]
        if model.get("unk_id") is not None:
            model["unk_id"] = new.get(model["unk_id"])
    else:
        unk = model.get("unk_token")
        old_unk = next((i for i, p in pieces.items() if p == unk), None)
        model["vocab"] = {name: i for i, name in enumerate(names)}
        if unk is not None:
            model["unk_token"] = names[new[old_unk]] if old_unk in new else None
    data["added_tokens"] = [
        {**token, "id": new[token["id"]], "content": names[new[token["id"]]]}
        for token in added
        if token["id"] in new
    ]
    data["post_processor"] = None
    inner = RustTokenizer.from_str(json.dumps(data))
    if vocab.prefix or vocab.suffix:
        before = [names[new[i]] for i in vocab.prefix]
        after = [names[new[i]] for i in vocab.suffix]
        inner.post_processor = TemplateProcessing(
            single=[*before, "$A", *after],
            pair=[*before, "$A", *after, "$B", *after],
            special_tokens=[(names[new[i]], new[i]) for i in {*vocab.prefix, *vocab.suffix}],
        )
    return PreTrainedTokenizerFast(
        tokenizer_object=inner,
        **{role: names[new[i]] for role, i in vocab.roles.items()},
        model_input_names=list(input_names),
        clean_up_tokenization_spaces=False,  # decode as tformer does, spaces as they come
        model_max_length=max_len,
    )


def save_tokenizer(fast: Any, folder: Path) -> None:
    """Save ``fast`` into ``folder``, named explicitly as a ``PreTrainedTokenizerFast`` so that
    ``AutoTokenizer`` loads tokenizer.json and not the family's own tokenizer class (whose
    files, a SentencePiece model or vocab.txt, the folder does not have)."""
    fast.save_pretrained(str(folder))
    path = folder / TOKENIZER_CONFIG
    settings = json_loads(path.read_text(encoding="utf-8"))
    settings["tokenizer_class"] = "PreTrainedTokenizerFast"
    path.write_text(json.dumps(settings, indent=2) + "\n", encoding="utf-8")


# -- generation -------------------------------------------------------------------------------


def set_generation(model: Any, *, max_new_tokens: int | None = None, **ids: Any) -> None:
    """Greedy decoding, the token ids given (``eos_token_id=2`` ...), and at most
    ``max_new_tokens`` (None: transformers' default); ``max_length`` is left at its default,
    so a caller's ``max_new_tokens`` never conflicts with it."""
    generation = model.generation_config
    for name, value in ids.items():
        setattr(generation, name, value)
    generation.max_new_tokens = max_new_tokens
    generation.num_beams = 1
    generation.do_sample = False


# -- weights ----------------------------------------------------------------------------------


def embedding_scale(config: ModelConfig) -> float:
    """What tformer multiplies token embeddings by (√d_model, or 1 with --no-embedding-scale)."""
    return math.sqrt(config.d_model) if config.embedding_scale else 1.0


def input_embedding(stack: Encoder | Decoder, config: ModelConfig) -> torch.Tensor:
    """(V, D) what a stack adds for each token id: its embedding row, times tformer's scale
    (folded in, for a target that scales nothing)."""
    return stack.embedding.weight.detach().float() * embedding_scale(config)


def position_table(stack: Encoder | Decoder, config: ModelConfig) -> torch.Tensor:
    """(positions_held, D) the vectors a stack adds at each position: its learned table, or
    the paper's sinusoids (the same numbers as a learned table)."""
    table = stack.positions.vectors()
    assert table is not None  # the exports refuse RoPE and relative positions first
    return table.detach().float()


def segment(stack: Encoder | Decoder, config: ModelConfig) -> torch.Tensor:
    """(D,) the vector tformer adds to every token (BERT's segment 0), zeros without one."""
    vector = stack.embedding.segment
    return torch.zeros(config.d_model) if vector is None else vector.detach().float()


def float_state(model: TransformerBase) -> dict[str, torch.Tensor]:
    """The model's weights as float32 tensors, detached."""
    return {name: t.detach().float() for name, t in model.state_dict().items()}


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, torch.Tensor]:
    """A nested dict of tensors as one of dotted names."""
    flat: dict[str, torch.Tensor] = {}
    for name, value in tree.items():
        key = f"{prefix}{name}"
        if isinstance(value, dict):
            flat.update(flatten(value, f"{key}."))
        else:
            flat[key] = value
    return flat


def load_exact(target: Any, state: dict[str, torch.Tensor], computed: Sequence[str] = ()) -> Any:
    """Load ``state`` into ``target`` (a transformers model), every weight placed and none left
    over (names ending in one of ``computed`` aside: buffers it derives itself); eval mode."""
    missing, unexpected = target.load_state_dict(state, strict=False)
    leftover = [name for name in missing if not name.endswith(tuple(computed))]
    assert not unexpected and not leftover, (unexpected, leftover)
    return target.eval()


def readme(title: str, snippet: str, notes: str) -> str:
    """An export's README.md: how to load and call it, then what tformer baked in."""
    return f"""# {title} exported by tformer

Load and call it with only this folder:

```python
{snippet.strip()}
```

What tformer does, baked in (no extra option needed):

{notes.strip()}

The weights are tformer's, renamed (and rearranged where the layouts differ): the model
computes the same function as the checkpoint.
"""
