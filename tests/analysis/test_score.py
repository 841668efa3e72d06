"""`tformer score`: per-position losses add up to evaluate's and training's loss, the decoder
input is <bos> + reference, a hand-built model gives hand-computed rows, and the CLI."""

from __future__ import annotations

import csv
import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner, Result

from tests.conftest import refusal_lines
from tformer.analysis.evaluate import teacher_forced_loss
from tformer.analysis.score import (
    decoder_masks,
    score_pair,
    score_pairs,
    score_tsv,
    summarize,
    worst,
)
from tformer.checkpoint.store import Checkpoint, load_checkpoint
from tformer.cli.commands import app
from tformer.config import BOS_ID, EOS_ID, ModelConfig
from tformer.data.batching import collate
from tformer.data.prepare import text_splits
from tformer.errors import DataError
from tformer.model import Transformer
from tformer.training.loss import sequence_loss
from tformer.training.run import TrainResult

PAIR = ("3 1 4", "three one four")
WRONG = ("3 1 4", "three two four")  # the model's top choice at "two" is "one"


@pytest.fixture(scope="module")
def ckpt(trained: TrainResult) -> Checkpoint:
    return load_checkpoint(trained.run_dir)


def test_pair_losses_sum_to_evaluates_teacher_forced_loss(ckpt: Checkpoint) -> None:
    scored = score_pair(ckpt.model, ckpt.tokenizers, *WRONG)
    mean, tokens = teacher_forced_loss(ckpt, [WRONG])
    assert scored.tokens == tokens == len(ckpt.tokenizers.target.encode(WRONG[1])) + 1
    assert scored.loss_sum == pytest.approx(mean * tokens, rel=1e-5)
    assert scored.loss == pytest.approx([-math.log(p) for p in scored.p_label], rel=1e-4)


def test_split_losses_sum_to_evaluates_loss_in_batches(ckpt: Checkpoint, toy_data: Path) -> None:
    pairs = text_splits(str(toy_data))["test"][:120]
    scores = score_pairs(ckpt.model, ckpt.tokenizers, pairs, max_tokens=256)  # several batches
    mean, tokens = teacher_forced_loss(ckpt, pairs)
    summary = summarize(scores)
    assert [s.index for s in scores] == list(range(len(pairs)))
    assert [(s.source, s.reference) for s in scores] == [tuple(p) for p in pairs]
    assert summary.tokens == tokens
    assert summary.mean_loss == pytest.approx(mean, rel=1e-5)
    alone = score_pair(ckpt.model, ckpt.tokenizers, *pairs[7])  # batching changes nothing
    assert scores[7].loss == pytest.approx(alone.loss, abs=1e-4)
    ranked = worst(scores, 5)
    assert [s.mean_loss for s in ranked] == sorted((s.mean_loss for s in scores), reverse=True)[:5]


def test_smoothed_losses_are_the_training_loss_with_dropout_off(ckpt: Checkpoint) -> None:
    config = dataclasses.replace(ckpt.model_config, dropout=0.3)
    model = Transformer(config)
    model.load_state_dict(ckpt.model.state_dict())
    model.train()  # as training leaves it: score_pairs must switch dropout off, then back
    pairs = [PAIR, WRONG, ("9 0", "nine zero")]
    scores = score_pairs(model, ckpt.tokenizers, pairs, label_smoothing=0.1)
    assert model.training
    tok = ckpt.tokenizers
    batch = collate([(tok.source.encode(s), tok.target.encode(t)) for s, t in pairs])
    with torch.no_grad():
        logits = model.eval()(batch.src, batch.tgt_in).logits
    smoothed = float(sequence_loss(logits, batch.tgt_out, 0.1))
    plain = float(sequence_loss(logits, batch.tgt_out, 0.0))
    assert math.fsum(s.smoothed_loss_sum for s in scores) == pytest.approx(smoothed, rel=1e-5)
    assert math.fsum(s.loss_sum for s in scores) == pytest.approx(plain, rel=1e-5)
    assert all(a > b for s in scores for a, b in zip(s.smoothed_loss, s.loss, strict=True)
               if b < 1.0)  # smoothing costs a confident right answer something


def test_decoder_input_is_bos_then_the_reference(ckpt: Checkpoint) -> None:
    scored = score_pair(ckpt.model, ckpt.tokenizers, *PAIR)
    ids = ckpt.tokenizers.target.encode(PAIR[1])
    assert scored.input_ids == [BOS_ID, *ids]
    assert scored.label_ids == [*ids, EOS_ID]
    assert scored.input_tokens[0] == "<bos>" and scored.label_tokens[-1] == "<eos>"
    assert scored.input_tokens[1:] == scored.label_tokens[:-1]
    causal, cross = decoder_masks(scored)
    assert torch.equal(causal, torch.ones(len(ids) + 1, len(ids) + 1).tril().bool())
    assert cross.shape == (len(ids) + 1, len(scored.source_ids)) and bool(cross.all())


def constant_logit_model(vocab: int, logits: list[float]) -> Transformer:
    """A model whose logits are ``logits`` at every position: the last post-norm LayerNorm
    is set to output its bias (weight 0), and the untied output projection is the identity."""
    config = ModelConfig(src_vocab_size=vocab, tgt_vocab_size=vocab, d_model=vocab, n_heads=4,
                         n_encoder_layers=1, n_decoder_layers=1, d_ff=32, dropout=0.0,
                         max_len=32, tie_embeddings=False, share_embeddings=False)
    model = Transformer(config)
    with torch.no_grad():
        norm = model.decoder.layers[-1].norm3
        norm.weight.zero_()
        norm.bias.copy_(torch.tensor(logits))
        assert model.output_projection is not None
        model.output_projection.weight.copy_(torch.eye(vocab))
    return model


def test_a_hand_built_model_gives_hand_computed_rows(ckpt: Checkpoint) -> None:
    tok = ckpt.tokenizers
    vocab = tok.target.vocab_size
    three, one = tok.target.encode("three one")[0], tok.target.encode("three one")[-1]
    logits = [0.0] * vocab
    logits[three], logits[one] = 2.0, 1.0
    model = constant_logit_model(vocab, logits)
    eps = 0.2
    scored = score_pair(model, tok, "3 1", "three one", label_smoothing=eps)
    z = (vocab - 2) + math.exp(2.0) + math.exp(1.0)  # Σ exp(logit)
    lse = math.log(z)
    for t, label in enumerate(scored.label_ids):
        x = logits[label]
        assert scored.p_label[t] == pytest.approx(math.exp(x) / z, rel=1e-5)
        assert scored.rank[t] == {three: 1, one: 2}.get(label, 3)  # ties share the better rank
        assert scored.top_ids[t] == three and scored.top_tokens[t] == tok.target.id_to_token(three)
        assert scored.p_top[t] == pytest.approx(math.exp(2.0) / z, rel=1e-5)
        assert scored.loss[t] == pytest.approx(lse - x, rel=1e-5)
        smoothed = lse - (1 - eps) * x - eps / vocab * sum(logits)
        assert scored.smoothed_loss[t] == pytest.approx(smoothed, rel=1e-5)
    assert scored.mismatches == [t for t, y in enumerate(scored.label_ids) if y != three]
    assert scored.label_ids[-1] == EOS_ID and scored.rank[-1] == 3


def test_tsv_escapes_tabs_and_has_one_line_per_position(ckpt: Checkpoint) -> None:
    scores = score_pairs(ckpt.model, ckpt.tokenizers, [PAIR, WRONG])
    lines = score_tsv(scores).splitlines()
    assert lines[0].split("\t")[:4] == ["pair", "position", "input", "label"]
    assert len(lines) == 1 + sum(s.tokens for s in scores)
    assert all(len(line.split("\t")) == len(lines[0].split("\t")) for line in lines)


def test_an_unencodable_reference_is_refused(ckpt: Checkpoint) -> None:
    with pytest.raises(DataError, match="'é' cannot be encoded by the target tokenizer"):
        score_pair(ckpt.model, ckpt.tokenizers, "3", "threé")


# -- the command line -------------------------------------------------------------------------


def run(*args: str) -> Result:
    return CliRunner().invoke(app, ["score", *args])


def words(text: str) -> str:
    """Text with every run of white space made one space (Rich wraps titles and captions)."""
    return " ".join(text.split())


def test_cli_table_marks_where_the_top_choice_differs(trained: TrainResult,
                                                      ckpt: Checkpoint) -> None:
    result = run(str(trained.run_dir), *WRONG)
    assert result.exit_code == 0, result.output
    rows = [line for line in result.stdout.splitlines() if "▁two" in line]
    assert len(rows) == 2  # read at one position, predicted at the one before
    assert any("≠" in row for row in rows)
    assert "perplexity" in result.stdout
    good = run(str(trained.run_dir), *PAIR)
    n = len(ckpt.tokenizers.target.encode(PAIR[1])) + 1
    assert good.exit_code == 0 and f"(0 of {n} positions)" in words(good.stdout)


def test_cli_json_with_masks(trained: TrainResult, ckpt: Checkpoint) -> None:
    result = run(str(trained.run_dir), *WRONG, "--json", "--masks")
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)  # nothing but the JSON on stdout
    scored = score_pair(ckpt.model, ckpt.tokenizers, *WRONG)
    assert [p["label_id"] for p in record["positions"]] == scored.label_ids
    assert record["positions"][0]["input"] == "<bos>"
    assert record["loss_sum"] == pytest.approx(scored.loss_sum, rel=1e-6)
    # At least the wrong word; how many more the tiny model misses depends on its training's
    # float sums (thread count), so the library's own count is the reference.
    assert record["mismatches"] == len(scored.mismatches) >= 1
    assert sum(p["mismatch"] for p in record["positions"]) == record["mismatches"]
    n = scored.tokens
    assert record["masks"]["self_attention"] == [[int(c <= r) for c in range(n)]
                                                 for r in range(n)]
    assert record["masks"]["cross_attention_columns"] == scored.source_tokens


def test_cli_draws_the_masks(trained: TrainResult) -> None:
    result = run(str(trained.run_dir), *PAIR, "--masks")
    assert result.exit_code == 0, result.output
    assert "self-attention mask (causal)" in result.stdout
    assert "cross-attention mask" in result.stdout


def test_cli_split_json_matches_evaluate_and_writes_the_tsv(
    trained: TrainResult, ckpt: Checkpoint, toy_data: Path, tmp_path: Path
) -> None:
    out = tmp_path / "deep" / "tokens.tsv"
    result = run(str(trained.run_dir), "--data", str(toy_data), "--split", "validation",
                 "--limit", "40", "--worst", "3", "--json", "--out", str(out))
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)
    pairs = text_splits(str(toy_data))["validation"][:40]
    mean, tokens = teacher_forced_loss(ckpt, pairs)
    assert record["summary"]["pairs"] == 40 and record["summary"]["tokens"] == tokens
    assert record["summary"]["mean_loss"] == pytest.approx(mean, rel=1e-5)
    worst_losses = [w["mean_loss"] for w in record["worst"]]
    assert worst_losses == sorted((p["mean_loss"] for p in record["pairs"]), reverse=True)[:3]
    with open(out, encoding="utf-8", newline="") as handle:
        rows = list(csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))
    assert len(rows) == tokens
    assert {int(r["pair"]) for r in rows} == set(range(40))
    assert math.fsum(float(r["loss"]) for r in rows) == pytest.approx(mean * tokens, rel=1e-6)


def test_cli_split_tables(trained: TrainResult, toy_data: Path) -> None:
    result = run(str(trained.run_dir), "--data", str(toy_data), "--split", "test",
                 "--limit", "30", "--worst", "2")
    assert result.exit_code == 0, result.output
    shown = words(result.stdout)
    assert "[test]: teacher forcing" in shown and "mean loss" in shown
    assert "the 2 pairs of highest mean loss" in shown


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["3", "threé"], 3, "cannot be encoded by the target tokenizer"),
        (["--data", "{data}", "--split", "dev"], 3, "--split dev: not in the data"),
        (["--data", "{data}", "--worst", "0"], 2, "--worst 0 must be >= 1"),
        (["--data", "{data}", "--limit", "0"], 2, "--limit 0 must be >= 1"),
        (["3", "three", "--data", "{data}"], 2, "give one or the other"),
        (["3"], 2, "REFERENCE missing"),
        (["3", "three", "--limit", "5"], 2, "--limit 5 applies to a split"),
        (["--data", "{data}", "--masks"], 2, "--masks draws one pair's masks"),
        (["3", ""], 3, "the target is empty"),
        (["1 " * 40, "one"], 3, "tokens, over --max-len 64"),
        (["3", "three", "--out", "{tmp}"], 2, "is a folder"),
    ],
)
def test_cli_refusals_are_one_line(trained: TrainResult, toy_data: Path, tmp_path: Path,
                                   args: list[str], code: int, message: str) -> None:
    filled = [a.format(data=toy_data, tmp=tmp_path) for a in args]
    result = run(str(trained.run_dir), *filled)
    assert result.exit_code == code, result.output
    assert result.stdout == ""
    lines = refusal_lines(result.stderr)
    assert len(lines) == 1 and message in lines[0], result.stderr


def test_a_refused_reference_leaves_the_out_file_alone(trained: TrainResult,
                                                       tmp_path: Path) -> None:
    out = tmp_path / "tokens.tsv"
    out.write_bytes(b"before\n")
    result = run(str(trained.run_dir), "3", "threé", "--out", str(out))
    assert result.exit_code == 3
    assert out.read_bytes() == b"before\n"
    assert [p.name for p in tmp_path.iterdir()] == ["tokens.tsv"]  # no temporary left behind
