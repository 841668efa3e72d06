"""Ensemble decoding against each member computed on its own: the mean of log-probabilities,
beam scores recomputed by teacher forcing, cached against recomputed steps, refusals."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from tformer.checkpoint.store import Checkpoint, Tokenizers
from tformer.config import BOS_ID, EOS_ID, ModelConfig, TrainConfig
from tformer.data.batching import pad
from tformer.data.tokenizer import Tokenizer, train_tokenizer
from tformer.decoding.api import decode, decode_texts
from tformer.decoding.ensemble import Ensemble, ensemble_of
from tformer.decoding.logits import mask_special_tokens
from tformer.decoding.settings import DecodingConfig, Hypothesis
from tformer.errors import CheckpointError, ConfigError
from tformer.model import TransformerBase, build_model

VOCAB = 24
SETTINGS = {
    "greedy": DecodingConfig(max_new_tokens=6),
    "beam": DecodingConfig(beam_size=3, n_best=3, max_new_tokens=6),
    "sampling": DecodingConfig(temperature=1.0, num_samples=2, seed=3, max_new_tokens=6),
}
SRC = pad([[5, 6, 7, 8], [9, 10], [11, 12, 13]])


def tiny(seed: int, arch: str = "encoder-decoder", vocab: int = VOCAB) -> TransformerBase:
    torch.manual_seed(seed)
    config = ModelConfig(arch=arch, src_vocab_size=vocab, tgt_vocab_size=vocab, d_model=32,
                         n_heads=4, n_encoder_layers=1, n_decoder_layers=2, d_ff=64,
                         dropout=0.0, max_len=32)  # fmt: skip
    return build_model(config).eval()


def same(got: list[list[Hypothesis]], want: list[list[Hypothesis]]) -> None:
    for got_row, want_row in zip(got, want, strict=True):
        assert [h.ids for h in got_row] == [h.ids for h in want_row]
        for g, w in zip(got_row, want_row, strict=True):
            assert g.token_logprobs == pytest.approx(w.token_logprobs, abs=1e-5)


def first_logp(model: TransformerBase, src: torch.Tensor) -> torch.Tensor:
    """(B, V) the model's own log-probabilities of the first token, by teacher forcing."""
    bos = torch.full((src.size(0), 1), BOS_ID)
    return model(src, bos).logits[:, -1].log_softmax(-1)


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_an_ensemble_of_one_or_of_two_copies_decodes_as_the_model_alone(setting: str) -> None:
    model = tiny(0)
    config = SETTINGS[setting]
    alone = decode(model, SRC, config)
    same(decode(Ensemble([model]), SRC, config), alone)
    same(decode(Ensemble([model, copy.deepcopy(model)]), SRC, config), alone)


@torch.no_grad()
def test_an_ensemble_of_one_steps_the_models_distribution() -> None:
    model = tiny(0)
    bos = torch.full((SRC.size(0),), BOS_ID)
    got = Ensemble([model]).stepper(SRC).step(bos).log_softmax(-1)
    torch.testing.assert_close(got, first_logp(model, SRC))


@torch.no_grad()
@pytest.mark.parametrize("weights", [None, [1.0, 3.0]])
def test_the_first_step_is_the_weighted_mean_of_the_members_log_probabilities(
    weights: list[float] | None,
) -> None:
    a, b = tiny(0), tiny(1)
    bos = torch.full((SRC.size(0),), BOS_ID)
    got = Ensemble([a, b], weights).stepper(SRC).step(bos)
    w = [0.5, 0.5] if weights is None else [0.25, 0.75]
    want = w[0] * first_logp(a, SRC) + w[1] * first_logp(b, SRC)
    torch.testing.assert_close(got, want)
    assert not torch.allclose(first_logp(a, SRC), first_logp(b, SRC))  # the members differ


@torch.no_grad()
def test_beam_scores_are_sums_of_the_averaged_log_probabilities() -> None:
    """Each hypothesis rescored by teacher forcing through each member: per token the softmax
    of the mean of the members' log-probabilities (<pad> and <bos> ruled out, as decoding
    rules them out); with length_penalty 0 the beam score is their sum."""
    a, b = tiny(0), tiny(1)
    config = DecodingConfig(beam_size=3, n_best=3, length_penalty=0.0, max_new_tokens=6)
    results = decode(Ensemble([a, b]), SRC, config)
    for row, hyps in enumerate(results):
        assert len(hyps) == 3
        for hyp in hyps:
            out = hyp.ids + ([EOS_ID] if hyp.finished else [])
            tgt_in = torch.tensor([[BOS_ID, *out[:-1]]])
            src = SRC[row : row + 1]
            mean = sum(m(src, tgt_in).logits.log_softmax(-1) for m in (a, b)) / 2
            logp = mask_special_tokens(mean[0]).log_softmax(-1)
            steps = logp[torch.arange(len(out)), torch.tensor(out)]
            assert hyp.token_logprobs == pytest.approx(steps.tolist(), abs=1e-5)
            assert hyp.score == pytest.approx(float(steps.sum()), abs=1e-4)


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_cached_ensemble_decoding_equals_recomputed(setting: str) -> None:
    ensemble = Ensemble([tiny(0), tiny(1), tiny(2)])
    config = SETTINGS[setting]
    recomputed = decode(ensemble, SRC, DecodingConfig(**{**vars(config), "use_cache": False}))
    same(decode(ensemble, SRC, config), recomputed)


@pytest.mark.parametrize("setting", ["greedy", "beam"])
def test_decoder_only_members_continue_prompts_together(setting: str) -> None:
    model = tiny(0, "decoder-only")
    prompts = [[5, 6, 7], [9, 10], [11]]
    config = SETTINGS[setting]
    same(decode_texts(Ensemble([model, copy.deepcopy(model)]), prompts, config),
         decode_texts(model, prompts, config))  # fmt: skip
    two = Ensemble([model, tiny(1, "decoder-only")])
    recomputed = DecodingConfig(**{**vars(config), "use_cache": False})
    same(decode_texts(two, prompts, config), decode_texts(two, prompts, recomputed))


@torch.no_grad()
def test_teacher_forcing_gives_the_mean_of_the_members_log_probabilities() -> None:
    a, b = tiny(0), tiny(1)
    tgt_in = torch.tensor([[BOS_ID, 5, 6], [BOS_ID, 7, 8], [BOS_ID, 9, 9]])
    want = (a(SRC, tgt_in).logits.log_softmax(-1) + b(SRC, tgt_in).logits.log_softmax(-1)) / 2
    torch.testing.assert_close(Ensemble([a, b])(SRC, tgt_in).logits, want)


# -- members loaded as checkpoints: tokenizers, refusals -------------------------------------

TEXTS = ["one two three four five", "six seven eight nine", "zero one two"] * 20


def checkpoint(model: TransformerBase, source: Tokenizer, target: Tokenizer, name: str) -> (
    Checkpoint
):
    return Checkpoint(model, model.config, TrainConfig(), Tokenizers(source, target), 0,
                      Path(name))  # fmt: skip


def sized(seed: int, source: Tokenizer, target: Tokenizer, arch: str = "encoder-decoder") -> (
    TransformerBase
):
    torch.manual_seed(seed)
    config = ModelConfig(arch=arch, src_vocab_size=source.vocab_size,
                         tgt_vocab_size=target.vocab_size, d_model=32, n_heads=4,
                         n_encoder_layers=1, n_decoder_layers=1, d_ff=64, max_len=32,
                         share_embeddings=source is target)  # fmt: skip
    return build_model(config).eval()


@torch.no_grad()
def test_each_member_reads_the_source_with_its_own_tokenizer() -> None:
    words = train_tokenizer(TEXTS, kind="wordpiece", vocab_size=60)
    chars = train_tokenizer(TEXTS, kind="unigram", vocab_size=40)
    target = train_tokenizer(TEXTS, vocab_size=40)
    a = checkpoint(sized(0, words, target), words, target, "a")
    b = checkpoint(sized(1, chars, target), chars, target, "b")
    ensemble = ensemble_of([a, b])
    text = "two three nine"
    src = pad([words.encode(text)])
    by_words, by_chars = ensemble.member_sources(src)
    assert by_words.tolist() == [words.encode(text)]
    assert by_chars.tolist() == [chars.encode(text)]
    bos = torch.full((1,), BOS_ID)
    want = (first_logp(a.model, by_words) + first_logp(b.model, pad([chars.encode(text)]))) / 2
    torch.testing.assert_close(ensemble.stepper(src).step(bos), want)


def test_another_target_vocabulary_is_refused_in_one_line_naming_both() -> None:
    tokenizer = train_tokenizer(TEXTS, vocab_size=40)
    other = train_tokenizer(["ten eleven twelve"] * 20, vocab_size=40)
    a = checkpoint(sized(0, tokenizer, tokenizer), tokenizer, tokenizer, "runs/a")
    b = checkpoint(sized(1, tokenizer, other), tokenizer, other, "runs/b")
    with pytest.raises(CheckpointError) as refused:
        ensemble_of([a, b])
    message = str(refused.value)
    assert "runs/a" in message and "runs/b" in message and "target vocabulary" in message
    assert "\n" not in message


def test_members_of_another_family_are_refused() -> None:
    tokenizer = train_tokenizer(TEXTS, vocab_size=40)
    pair = checkpoint(sized(0, tokenizer, tokenizer), tokenizer, tokenizer, "runs/pair")
    gpt = sized(1, tokenizer, tokenizer, "decoder-only")
    lm = checkpoint(gpt, tokenizer, tokenizer, "runs/gpt")
    with pytest.raises(ConfigError, match="one family: runs/pair is encoder-decoder, runs/gpt"):
        ensemble_of([pair, lm])
    bert = train_tokenizer(TEXTS, vocab_size=40, specials=("<mask>",))
    masked = checkpoint(sized(2, bert, bert, "encoder-only"), bert, bert, "runs/bert")
    with pytest.raises(ConfigError, match="runs/bert is encoder-only: it does not generate"):
        ensemble_of([pair, masked])


def test_weights_must_be_positive_one_per_member() -> None:
    with pytest.raises(ConfigError, match="one positive number per member"):
        Ensemble([tiny(0), tiny(1)], [1.0, 0.0])
    with pytest.raises(ConfigError, match="one positive number per member"):
        Ensemble([tiny(0)], [1.0, 1.0])
