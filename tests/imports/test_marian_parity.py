"""An imported Marian model computes what transformers' MarianMTModel computes: logits within
1e-4 on many inputs (tformer's ids mapped through the vocabulary order), and the same greedy
and beam-4 outputs as ``generate`` with the matching settings, for each architecture OPUS-MT
uses (swish / relu / gelu; shared and separate vocabularies; tied and untied output)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from tests.imports.conftest import CASES, MarianCase, lines
from tformer.checkpoint import load_checkpoint
from tformer.checkpoint.store import Checkpoint
from tformer.config import BOS_ID, PAD_ID
from tformer.decoding.api import decode_texts
from tformer.decoding.settings import DecodingConfig
from tformer.imports import import_model
from tformer.imports.check import compared_rows
from tformer.imports.weights import never_rows

INPUTS = 40
MAX_NEW = 12


@pytest.fixture(scope="module")
def imported(
    marian_case: Callable[[str], MarianCase], tmp_path_factory: pytest.TempPathFactory
) -> Callable[[str], tuple[MarianCase, Checkpoint]]:
    done: dict[str, tuple[MarianCase, Checkpoint]] = {}

    def get(name: str) -> tuple[MarianCase, Checkpoint]:
        if name not in done:
            case = marian_case(name)
            out = import_model(case.folder, tmp_path_factory.mktemp("imported") / name)
            done[name] = (case, load_checkpoint(out))
        return done[name]

    return get


def sources(toy_data: Path) -> list[str]:
    """Test sources short enough for the tiny models' 64 positions (with </s>)."""
    return [t for t in lines("test2016", "en", 3 * INPUTS, toy_data) if len(t) < 90][:INPUTS]


def orders(case: MarianCase, ckpt: Checkpoint) -> tuple[list[int | None], list[int | None]]:
    """tformer id -> Marian id, per side (None: a row Marian has not)."""
    from tformer.data.marian_spm import marian_tokenizers

    config = case.model.config
    found = marian_tokenizers(
        case.folder,
        pad_id=config.pad_token_id,
        eos_id=config.eos_token_id,
        decoder_start_id=config.decoder_start_token_id,
    )
    return found.source_order, found.target_order


@pytest.mark.parametrize("name", CASES)
def test_logits_equal_transformers(
    name: str, imported: Callable[[str], tuple[MarianCase, Checkpoint]], toy_data: Path
) -> None:
    case, ckpt = imported(name)
    config = ckpt.model_config
    assert config.source_eos and config.output_bias
    activation = CASES[name][0]
    assert config.activation == ("silu" if activation == "swish" else activation)
    assert (config.share_embeddings, config.tie_embeddings) == CASES[name][1:]
    src_order, tgt_order = orders(case, ckpt)
    texts = sources(toy_data)
    targets = lines("test2016", "de", INPUTS, toy_data)
    src = [ckpt.tokenizers.source.encode(t) for t in texts]
    tgt = [ckpt.tokenizers.target.encode(t)[:30] for t in targets]
    batch = case.tokenizer(texts, return_tensors="pt", padding=True)
    # MarianTokenizer's ids are tformer's mapped through the order, </s> appended.
    for ids, theirs, mask in zip(src, batch.input_ids, batch.attention_mask, strict=True):
        assert [src_order[i] for i in ids] + [config_eos(case)] == theirs[mask.bool()].tolist()
    width = max(map(len, tgt)) + 1
    tgt_in = torch.full((len(tgt), width), PAD_ID)
    theirs_in = torch.full((len(tgt), width), case.model.config.pad_token_id)
    for row, ids in enumerate(tgt):
        tgt_in[row, : len(ids) + 1] = torch.tensor([BOS_ID, *ids])
        theirs_in[row, : len(ids) + 1] = torch.tensor([tgt_order[i] for i in [BOS_ID, *ids]])
    src_t = torch.full((len(src), max(map(len, src))), PAD_ID)
    for row, ids in enumerate(src):
        src_t[row, : len(ids)] = torch.tensor(ids)
    with torch.no_grad():
        ours = ckpt.model(src_t, tgt_in).logits
        hf = case.model(**batch, decoder_input_ids=theirs_in).logits
    # Every row but <pad> and <bos> (never predicted: tformer's logits bias holds them off)
    # and rows that stand for no Marian token.
    keep, columns = compared_rows(tgt_order, ckpt.model.logits_bias)
    never = {PAD_ID, BOS_ID, *never_rows(tgt_order)}
    assert keep == [i for i in range(len(tgt_order)) if i not in never]
    real = torch.zeros_like(tgt_in, dtype=torch.bool)
    for row, ids in enumerate(tgt):
        real[row, : len(ids) + 1] = True
    difference = (ours[real][:, keep] - hf[real][:, columns]).abs().max()
    assert difference < 1e-4, difference


def config_eos(case: MarianCase) -> int:
    return int(case.model.config.eos_token_id)


# The constraint processors, which beam search applies to log-probabilities as generate does;
# a minimum length alone is where stopping early differed most.
MIN_LENGTH = dict(min_new_tokens=6)
CONSTRAINED = dict(min_new_tokens=6, no_repeat_ngram_size=2, repetition_penalty=1.3)


@pytest.mark.parametrize(
    "constraints", [{}, MIN_LENGTH, CONSTRAINED], ids=["plain", "min-length", "constrained"]
)
@pytest.mark.parametrize("beams", [1, 4])
@pytest.mark.parametrize("name", CASES)
def test_outputs_equal_generate(
    name: str,
    beams: int,
    constraints: dict[str, float],
    imported: Callable[[str], tuple[MarianCase, Checkpoint]],
    toy_data: Path,
) -> None:
    case, ckpt = imported(name)
    _, tgt_order = orders(case, ckpt)
    texts = sources(toy_data)
    src = [ckpt.tokenizers.source.encode(t) for t in texts]
    settings = DecodingConfig(beam_size=beams, max_new_tokens=MAX_NEW, length_penalty=1.0,
                              **constraints)  # type: ignore[arg-type]
    ours = [[tgt_order[i] for i in row[0].ids] for row in decode_texts(ckpt.model, src, settings)]
    pad = case.model.config.pad_token_id
    batch = case.tokenizer(texts, return_tensors="pt", padding=True)
    bias = case.model.final_logits_bias
    saved = bias.clone()
    try:
        # tformer never predicts <bos> (Marian's <pad>) and leaves it out of the softmax;
        # transformers 4 did the same for Marian (adjust_logits_during_generation), 5 needs
        # -inf in the bias for it (bad_words_ids acts after the softmax in beam search).
        bias[0, pad] = float("-inf")
        with torch.no_grad():
            generated = case.model.generate(
                **batch,
                num_beams=beams,
                max_new_tokens=MAX_NEW,
                length_penalty=1.0,
                do_sample=False,
                forced_eos_token_id=None,
                **constraints,
            )
    finally:
        bias.copy_(saved)
    eos = config_eos(case)
    theirs = []
    for row in generated.tolist():
        row = row[1:]
        theirs.append(row[: row.index(eos)] if eos in row else row)
    assert theirs == ours
