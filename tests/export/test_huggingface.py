"""The Hugging Face export is a MarianMTModel computing tformer's function: logits within
1e-4 on every post-norm variant, and on tiny trained models the same greedy outputs, loaded
with AutoModelForSeq2SeqLM / AutoTokenizer from the folder alone."""

from __future__ import annotations

import json
from collections.abc import Callable
from itertools import product
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.export.conftest import POST_NORM, random_model
from tests.export.helpers import readme_snippet, tformer_outputs
from tformer.checkpoint import load_checkpoint
from tformer.config import BOS_ID, EOS_ID, PAD_ID
from tformer.decoding.logits import mask_special_tokens
from tformer.decoding.settings import DecodingConfig
from tformer.export import MARKER, export_checkpoint
from tformer.export.huggingface import TARGET_TOKENIZER, to_marian

transformers = pytest.importorskip(
    "transformers", reason="transformers is not installed: pip install 'tformer[export]'"
)


def same_logits(ours: torch.Tensor, theirs: torch.Tensor) -> None:
    """Within 1e-4 where finite; -inf at the same places (<pad> and <bos>)."""
    ours = mask_special_tokens(ours.reshape(-1, ours.size(-1)))
    theirs = theirs.reshape(-1, theirs.size(-1))
    assert torch.equal(torch.isinf(ours), torch.isinf(theirs))
    assert torch.isinf(theirs[:, [PAD_ID, BOS_ID]]).all()
    finite = torch.isfinite(ours)
    difference = (ours[finite] - theirs[finite]).abs().max()
    assert difference < 1e-4, difference


ARCHITECTURES = [
    dict(zip(("activation", "tie_embeddings", "shared"), values, strict=True))
    for values in product(("relu", "gelu"), (True, False), (True, False))
]


@pytest.mark.parametrize("arch", ARCHITECTURES, ids=lambda a: "-".join(map(str, a.values())))
def test_every_post_norm_architecture_has_the_same_logits(arch: dict[str, Any]) -> None:
    changes = {k: v for k, v in arch.items() if k != "shared"}
    model = random_model(changes, shared=arch["shared"])
    marian = to_marian(model)
    generator = torch.Generator().manual_seed(2)
    src = torch.randint(4, model.config.src_vocab_size, (3, 11), generator=generator)
    src[0, 7:] = PAD_ID  # a padded source
    tgt_in = torch.randint(4, model.config.tgt_vocab_size, (3, 8), generator=generator)
    tgt_in[:, 0] = BOS_ID
    with torch.no_grad():
        ours = model(src, tgt_in).logits
        theirs = marian(
            input_ids=src, attention_mask=(src != PAD_ID).long(), decoder_input_ids=tgt_in
        ).logits
    same_logits(ours, theirs)


@pytest.mark.parametrize("shared", [True, False])
def test_marians_own_variants_export_with_the_same_logits(shared: bool) -> None:
    # SiLU ("swish"), a logits bias and the source's closing <eos>: what OPUS-MT models have.
    changes = {"activation": "silu", "output_bias": True, "source_eos": True}
    model = random_model(changes, shared=shared)
    assert model.logits_bias is not None and model.logits_bias.abs().sum() > 0
    marian = to_marian(model)
    assert marian.config.activation_function == "swish"
    generator = torch.Generator().manual_seed(3)
    src = torch.randint(4, model.config.src_vocab_size, (3, 9), generator=generator)
    src[1, 5:] = PAD_ID
    with_eos = torch.nn.functional.pad(src, (0, 1), value=PAD_ID)
    with_eos[torch.arange(3), (src != PAD_ID).sum(1)] = EOS_ID  # Marian's sources end in </s>
    tgt_in = torch.randint(4, model.config.tgt_vocab_size, (3, 7), generator=generator)
    tgt_in[:, 0] = BOS_ID
    with torch.no_grad():
        ours = model(src, tgt_in).logits
        theirs = marian(
            input_ids=with_eos, attention_mask=(with_eos != PAD_ID).long(), decoder_input_ids=tgt_in
        ).logits
    same_logits(ours, theirs)


@pytest.fixture(scope="module")
def exported(
    trained_variant: Callable[[str], Path], tmp_path_factory: pytest.TempPathFactory
) -> Callable[[str], Path]:
    done: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in done:
            out = tmp_path_factory.mktemp("hf") / name
            done[name] = export_checkpoint(trained_variant(name), out, to="huggingface")
        return done[name]

    return get


@pytest.mark.parametrize("variant", POST_NORM)
def test_loaded_export_matches_tformer(
    variant: str,
    exported: Callable[[str], Path],
    trained_variant: Callable[[str], Path],
    inputs: list[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    out, checkpoint = exported(variant), trained_variant(variant)
    readme = readme_snippet(out, monkeypatch)  # loads with AutoModelForSeq2SeqLM, AutoTokenizer
    model, tokenizer, target = readme["model"], readme["tokenizer"], readme["target"]
    assert type(model).__name__ == "MarianMTModel" and tokenizer.is_fast and target.is_fast
    ckpt = load_checkpoint(checkpoint)
    texts = [t for t in inputs if t]  # tformer reads an empty source as <eos>: see the README
    assert [tokenizer(t)["input_ids"] for t in texts] == [
        ckpt.tokenizers.source.encode(t) for t in texts
    ]
    ours, our_texts = tformer_outputs(checkpoint, texts, DecodingConfig())
    batch = tokenizer(texts, return_tensors="pt", padding=True)
    with torch.no_grad():
        generated = model.generate(**batch)
    theirs = [_cut(row[1:]) for row in generated.tolist()]
    assert theirs == ours
    assert target.batch_decode(generated, skip_special_tokens=True) == our_texts
    # Teacher-forced on tformer's own outputs: the logits agree within 1e-4.
    longest = max(map(len, ours)) + 1
    tgt_in = torch.full((len(ours), longest), PAD_ID)
    for i, ids in enumerate(ours):
        tgt_in[i, : len(ids) + 1] = torch.tensor([BOS_ID, *ids])
    with torch.no_grad():
        mine = ckpt.model(batch["input_ids"], tgt_in).logits
        hf = model(**batch, decoder_input_ids=tgt_in).logits
    same_logits(mine, hf)


def _cut(ids: list[int]) -> list[int]:
    """Generated ids up to the first <eos> (what follows is padding)."""
    return ids[: ids.index(EOS_ID)] if EOS_ID in ids else ids


def test_configs_and_tokenizers_say_what_tformer_does(
    exported: Callable[[str], Path], trained_variant: Callable[[str], Path]
) -> None:
    out = exported("post-relu-separate-untied")
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "marian"
    assert config["share_encoder_decoder_embeddings"] is False
    assert config["tie_word_embeddings"] is False
    generation = json.loads((out / "generation_config.json").read_text())
    max_len = load_checkpoint(trained_variant("post-relu-separate-untied")).model_config.max_len
    assert generation["decoder_start_token_id"] == BOS_ID
    assert generation["eos_token_id"] == EOS_ID and generation["pad_token_id"] == PAD_ID
    assert generation["max_new_tokens"] == max_len and "max_length" not in generation
    assert generation.get("num_beams", 1) == 1
    assert (out / "model.safetensors").is_file()
    assert not list(out.glob("*.bin"))  # no pickle
    auto = transformers.AutoTokenizer
    source, target = auto.from_pretrained(out), auto.from_pretrained(out / TARGET_TOKENIZER)
    for tokenizer in (source, target):
        assert (
            tokenizer.pad_token_id,
            tokenizer.bos_token_id,
            tokenizer.eos_token_id,
            tokenizer.unk_token_id,
        ) == (0, 1, 2, 3)
    assert source.get_vocab() != target.get_vocab()
    marker = json.loads((out / MARKER).read_text())
    assert marker["target"] == "huggingface"
    assert f"{TARGET_TOKENIZER}/tokenizer.json" in marker["files"]
