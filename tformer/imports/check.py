"""``tformer import --check``: an import compared with the model it came from, run by
transformers on a few sentences: token ids, logits, greedy outputs (Marian, T5, GPT-2) and
fill-mask's top token (BERT)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tformer.checkpoint.store import Checkpoint, load_checkpoint
from tformer.checkpoint.verify import Check
from tformer.config import BOS_ID, EOS_ID, MASK, PAD_ID
from tformer.data.hf_tokenizers import to_tformer_ids
from tformer.decoding.api import decode_texts
from tformer.decoding.settings import DecodingConfig
from tformer.errors import CheckpointError, ConfigError, DataError
from tformer.imports.common import INSTALL, NEVER, read_config

# Short English sentences the check reads when no --check-text is given.
SENTENCES = (
    "A man in a blue shirt is riding a bicycle.",
    "Two children are playing in the park.",
    "The cat sat on the mat by the window.",
    "She reads a book while the dog sleeps.",
    "The weather is nice today.",
)
TOLERANCE = 1e-3  # the largest absolute difference of a logit that passes
NEW_TOKENS = 8  # greedy outputs compared
# model_type -> the transformers class the folder holds.
CLASSES = {
    "marian": "MarianMTModel",
    "gpt2": "GPT2LMHeadModel",
    "bert": "BertForMaskedLM",
    "t5": "T5ForConditionalGeneration",
}


@dataclass
class _Pair:
    """The two models and tokenizers compared, and the id orders (tformer id -> foreign id)."""

    family: str
    model: Any  # the transformers model, eval mode
    tokenizer: Any  # the folder's own tokenizer (AutoTokenizer)
    ckpt: Checkpoint
    source_order: list[int | None]
    target_order: list[int | None]


def read_texts(path: Path) -> list[str]:
    """The non-empty lines of ``--check-text FILE``.

    Raises:
        DataError: the file cannot be read as UTF-8 text, or holds no line of text.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise DataError(f"--check-text {path}: cannot read it as UTF-8 text ({error})") from None
    texts = [line.strip() for line in text.splitlines() if line.strip()]
    if not texts:
        raise DataError(f"--check-text {path}: holds no line of text")
    return texts


def check_import(
    folder: Path, checkpoint: Path, texts: Sequence[str] | None = None
) -> list[Check]:
    """Compare an imported checkpoint with its source folder run by transformers.

    Each text is tokenised by the folder's tokenizer (``AutoTokenizer``) and the checkpoint's:
    (1) token ids equal through the import's id order; (2) the largest absolute difference of
    the logits of every row tformer predicts (mapped to transformers' vocabulary; <pad>, <bos>
    and rows masked as never predicted left out) within :data:`TOLERANCE`; (3) Marian, T5 and
    GPT-2: greedy outputs of :data:`NEW_TOKENS` new tokens equal; (4) BERT: fill-mask's top
    token equal. Texts tokenised differently, or longer than the model reads, are left out of
    (2) to (4).

    Args:
        folder: the local folder the import read (a hub id's cached folder).
        checkpoint: the imported checkpoint.
        texts: the sentences read; None: :data:`SENTENCES`.

    Returns:
        One ``Check`` per comparison; all ``ok`` means the import computes what transformers
        does on these texts.

    Raises:
        ConfigError: transformers is not installed.
        CheckpointError: the folder or the checkpoint cannot be read.
    """
    pair = _pair(Path(folder), Path(checkpoint))
    texts = list(texts or SENTENCES)
    checks = [_tokens(pair, texts)]
    # Room for <bos> / [CLS] and </s> in the model's positions.
    room = pair.ckpt.model_config.max_len - 2
    theirs = {t: _theirs(pair, t) for t in texts}
    alike = [t for t in texts if len(theirs[t]) <= room and _ours(pair, t) == theirs[t]]
    if not alike:
        none = f"no text is tokenised alike in at most {room} tokens: nothing to compare"
        return [*checks, Check("logits", False, none)]
    checks.append(_logits(pair, alike))
    if pair.family == "bert":
        checks.append(_fill_mask(pair, alike))
    else:
        checks.append(_greedy(pair, alike))
    return checks


def _pair(folder: Path, checkpoint: Path) -> _Pair:
    try:
        import transformers
    except ImportError:
        raise ConfigError(
            f"--check runs the source model with transformers, which is not installed; "
            f"{INSTALL}"
        ) from None
    family = read_config(folder).get("model_type")
    if family not in CLASSES:
        raise CheckpointError(f"{folder}: model_type {family!r} is not one tformer imports")
    model_class = getattr(transformers, CLASSES[family])
    bars = transformers.utils.logging.is_progress_bar_enabled()
    transformers.utils.logging.disable_progress_bar()  # no bar between the check's lines
    try:
        model = model_class.from_pretrained(str(folder), dtype=torch.float32).eval()
    finally:
        if bars:
            transformers.utils.logging.enable_progress_bar()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
    ckpt = load_checkpoint(checkpoint)
    ckpt.model.eval()
    source, target = _orders(family, folder, model.config, tokenizer)
    return _Pair(family, model, tokenizer, ckpt, source, target)


def _orders(
    family: str, folder: Path, config: Any, tokenizer: Any
) -> tuple[list[int | None], list[int | None]]:
    """tformer id -> the folder's id, for sources and targets, as the import ordered them."""
    if family == "marian":
        from tformer.imports.marian import folder_tokenizers

        found = folder_tokenizers(folder, config)
        return found.source_order, found.target_order
    if family == "gpt2":
        from tformer.imports.gpt2 import gpt2_order

        eot = config.eos_token_id if config.eos_token_id is not None else tokenizer.eos_token_id
        order = gpt2_order(config.vocab_size, eot)
    elif family == "bert":
        from tformer.imports.bert import bert_order

        order = bert_order(tokenizer, config.vocab_size, folder)
    else:
        from tformer.imports.t5 import t5_order

        order = t5_order(len(tokenizer))
    return order, order


def _ours(pair: _Pair, text: str) -> list[int | None]:
    """The checkpoint's tokens of ``text`` as the folder's ids (None: no such id)."""
    order = pair.source_order
    ids = pair.ckpt.tokenizers.source.encode(text)
    return [order[i] if 0 <= i < len(order) else None for i in ids]


def _theirs(pair: _Pair, text: str) -> list[int]:
    """The folder's tokens of ``text``, without the special tokens its tokenizer adds."""
    return list(pair.tokenizer(text, add_special_tokens=False)["input_ids"])


def _tokens(pair: _Pair, texts: list[str]) -> Check:
    differ = [t for t in texts if _ours(pair, t) != _theirs(pair, t)]
    count = sum(len(_theirs(pair, t)) for t in texts)
    if differ:
        return Check(
            "token ids",
            False,
            f"{len(differ)} of {len(texts)} texts tokenised differently, first: {differ[0]!r}",
        )
    return Check("token ids", True, f"{count} tokens of {len(texts)} texts equal")


def compared_rows(
    order: Sequence[int | None], bias: torch.Tensor | None = None
) -> tuple[list[int], list[int]]:
    """The rows of tformer's logits compared with transformers', and their columns there:
    every row but <pad>, <bos>, a row that stands for no foreign id, a row the logits bias
    holds at :data:`NEVER` (never predicted), and a later row of a foreign id already
    taken."""
    held = [] if bias is None else (bias.detach() <= NEVER).tolist()
    rows, columns, taken = [], [], set()
    for row, theirs in enumerate(order):
        never = bool(held) and held[row]
        if row in (PAD_ID, BOS_ID) or theirs is None or theirs in taken or never:
            continue
        taken.add(theirs)
        rows.append(row)
        columns.append(theirs)
    return rows, columns


def _logit_pairs(pair: _Pair, text: str) -> tuple[torch.Tensor, torch.Tensor]:
    """tformer's and transformers' logits of ``text`` at every position tformer predicts
    (its vocabulary order and theirs). GPT-2 reads <bos> then the text; BERT reads the text
    and </s> ([CLS] its own, put first by the model); a seq2seq model reads the text as its
    source (closed by </s> in the model) and again, by the target tokenizer, as the decoder's
    input after its start token (<bos>; transformers' <pad>)."""
    ckpt, model, tokenizer = pair.ckpt, pair.model, pair.tokenizer
    ids = ckpt.tokenizers.source.encode(text)
    limit = ckpt.model_config.max_len
    empty = torch.zeros(1, 0, dtype=torch.long)
    with torch.no_grad():
        if pair.family == "gpt2":
            ours_in = [BOS_ID, *ids][:limit]
            theirs_in = [pair.target_order[i] for i in ours_in]
            ours = ckpt.model(empty, torch.tensor([ours_in])).logits[0]
            return ours, model(torch.tensor([theirs_in])).logits[0]
        if pair.family == "bert":
            batch = tokenizer(text, return_tensors="pt")
            ours = ckpt.model(torch.tensor([[*ids, EOS_ID]])).logits[0]
            return ours, model(**batch).logits[0, 1:]  # [CLS]'s row: tformer predicts none
        target = [BOS_ID, *ckpt.tokenizers.target.encode(text)][:limit]
        decoder_in = torch.tensor([[pair.target_order[i] for i in target]])
        ours = ckpt.model(torch.tensor([ids]), torch.tensor([target])).logits[0]
        theirs = model(**tokenizer(text, return_tensors="pt"), decoder_input_ids=decoder_in)
        return ours, theirs.logits[0]


def _logits(pair: _Pair, texts: list[str]) -> Check:
    rows, columns = compared_rows(pair.target_order, pair.ckpt.model.logits_bias)
    worst = 0.0
    positions = 0
    for text in texts:
        ours, theirs = _logit_pairs(pair, text)
        if ours.shape[0] != theirs.shape[0]:
            return Check("logits", False, f"{ours.shape[0]} positions, transformers "
                         f"{theirs.shape[0]}, on {text!r}")  # fmt: skip
        worst = max(worst, float((ours[:, rows] - theirs[:, columns]).abs().max()))
        positions += ours.shape[0]
    detail = (
        f"max |difference| {worst:.2e} (tolerance {TOLERANCE:.0e}) over {positions} positions "
        f"x {len(rows)} rows"
    )
    return Check("logits", worst <= TOLERANCE, detail)


def _greedy(pair: _Pair, texts: list[str]) -> Check:
    """tformer's greedy decoding against transformers' ``generate`` (greedy, no other
    setting of the folder's generation_config), the columns of the rows tformer never
    predicts held off in both."""
    from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList

    ckpt, model, order = pair.ckpt, pair.model, pair.target_order
    sources = [ckpt.tokenizers.source.encode(t) for t in texts]
    settings = DecodingConfig(max_new_tokens=NEW_TOKENS)
    ours = [[order[i] for i in hyps[0].ids] for hyps in decode_texts(ckpt.model, sources, settings)]
    _, columns = compared_rows(order, ckpt.model.logits_bias)
    held = sorted(set(range(model.config.vocab_size)) - set(columns))
    eos = order[EOS_ID]

    class HoldOff(LogitsProcessor):
        def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
            return scores.index_fill(-1, torch.tensor(held, dtype=torch.long), float("-inf"))

    greedy = GenerationConfig(
        max_new_tokens=NEW_TOKENS,
        do_sample=False,
        num_beams=1,
        eos_token_id=eos,
        pad_token_id=model.config.pad_token_id if pair.family != "gpt2" else eos,
        decoder_start_token_id=getattr(model.config, "decoder_start_token_id", None),
    )
    theirs = []
    for text in texts:
        if pair.family == "gpt2":
            prompt = [order[BOS_ID], *_theirs(pair, text)]
            batch = {"input_ids": torch.tensor([prompt])}
        else:
            batch = dict(pair.tokenizer(text, return_tensors="pt"))
        with torch.no_grad():
            out = model.generate(
                **batch, generation_config=greedy, logits_processor=LogitsProcessorList([HoldOff()])
            )[0].tolist()
        start = len(prompt) if pair.family == "gpt2" else 1
        out = out[start:]
        theirs.append(out[: out.index(eos)] if eos in out else out)
    differ = [t for t, a, b in zip(texts, ours, theirs, strict=True) if a != b]
    if differ:
        return Check(
            "greedy", False, f"{len(differ)} of {len(texts)} outputs differ, first on {differ[0]!r}"
        )
    count = sum(map(len, ours))
    return Check("greedy", True, f"{len(texts)} outputs ({count} tokens, up to {NEW_TOKENS} "
                 "each) equal")  # fmt: skip


def _fill_mask(pair: _Pair, texts: list[str]) -> Check:
    """fill-mask's top token at the middle word of each text of two words or more, masked,
    against the top row of transformers' logits there."""
    from tformer.analysis.language import fill_mask
    from tformer.data.display import display_token

    to_ours = to_tformer_ids(pair.source_order)
    tokenizer, checked, differ = pair.ckpt.tokenizers.source, 0, []
    for text in texts:
        words = text.split()
        if len(words) < 2:
            continue
        words[len(words) // 2] = MASK
        masked = " ".join(words)
        ours = fill_mask(pair.ckpt, masked, top_k=1)[0].fillers[0].token
        batch = pair.tokenizer(masked.replace(MASK, pair.tokenizer.mask_token), return_tensors="pt")
        at = batch["input_ids"][0].tolist().index(pair.tokenizer.mask_token_id)
        with torch.no_grad():
            top = int(pair.model(**batch).logits[0, at].argmax())
        # as fill-mask shows tokens: a special one by the imported tokenizer's own name
        theirs = display_token(tokenizer, to_ours[top]) if top in to_ours else None
        checked += 1
        if ours != theirs:
            differ.append(f"{masked!r}: {ours!r}, transformers {theirs!r}")
    if not checked:
        return Check("fill-mask", False, "no text of two words or more to mask")
    if differ:
        return Check("fill-mask", False, f"{len(differ)} of {checked} top tokens differ: "
                     f"{differ[0]}")  # fmt: skip
    return Check("fill-mask", True, f"top token equal on {checked} texts")

