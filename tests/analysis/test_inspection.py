"""Attention maps: their maths against a by-hand recomputation, statistics, files, alignment."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import Tensor

from tests.conftest import ALIGNMENT_STEPS, numeric_dates, token_at
from tformer.analysis.attention import (
    AttentionResult,
    attention_maps,
    inspect_attention,
)
from tformer.analysis.attention_files import load_attention, save_attention
from tformer.analysis.head_stats import eos_column, head_statistics
from tformer.checkpoint.store import Checkpoint, load_checkpoint
from tformer.config import PAD_ID, preset
from tformer.data.pairs import encode_pairs
from tformer.data.sources import load_text_pairs
from tformer.errors import ConfigError, DataError
from tformer.model import Transformer
from tformer.model.attention import MultiHeadAttention
from tformer.training.run import TrainResult
from tformer.training.validation import exact_match

# The fast tier (-m "not slow") leaves this file out: its model trains for about 45 s.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def digits(trained: TrainResult) -> Checkpoint:
    return load_checkpoint(trained.run_dir)


@pytest.fixture(scope="module")
def result(digits: Checkpoint) -> AttentionResult:
    return inspect_attention(digits, "3 1 4 1", "three one four one")


def random_model(norm: str = "post") -> Transformer:
    torch.manual_seed(0)
    config = preset("tiny", d_model=32, n_heads=4, n_encoder_layers=2, n_decoder_layers=2,
                    d_ff=64, dropout=0.0, max_len=32, src_vocab_size=40, tgt_vocab_size=40,
                    norm=norm)
    return Transformer(config).eval()


PADDED_SRC = torch.tensor([[5, 6, 7, PAD_ID, PAD_ID], [8, 9, 10, 11, 12]])  # (B, S)
PADDED_TGT = torch.tensor([[1, 13, 14, 15], [1, 16, PAD_ID, PAD_ID]])  # (B, T), BOS first


# -- the maps are attention weights -----------------------------------------------------------


def test_every_row_sums_to_one_and_the_decoder_is_causal(result: AttentionResult) -> None:
    n_src, n_tgt = len(result.source_tokens), len(result.target_tokens)
    assert result.target_tokens[0] == "<bos>"
    assert result.encoder.shape[2:] == (n_src, n_src)
    assert result.decoder.shape[2:] == (n_tgt, n_tgt)
    assert result.cross.shape[2:] == (n_tgt, n_src)
    for kind in ("encoder", "decoder", "cross"):
        maps = result.maps(kind)
        assert (maps >= 0).all()
        torch.testing.assert_close(maps.sum(-1), torch.ones(maps.shape[:-1]))
    above = torch.ones(n_tgt, n_tgt, dtype=torch.bool).triu(1)
    assert (result.decoder[..., above] == 0).all()


def test_padding_columns_get_no_weight_in_a_batch() -> None:
    model = random_model()
    with torch.no_grad():
        maps = model(PADDED_SRC, PADDED_TGT, need_weights=True).attentions
    assert maps is not None
    pad = PADDED_SRC == PAD_ID  # (B, S)
    for layer in maps.encoder + maps.cross:  # (B, H, rows, S)
        assert (layer[0][..., pad[0]] == 0).all()
        assert (layer[0][..., ~pad[0]] > 0).all()
        torch.testing.assert_close(layer.sum(-1), torch.ones(layer.shape[:-1]))


def by_hand(attn: MultiHeadAttention, query: Tensor, key_value: Tensor, mask: Tensor) -> Tensor:
    """softmax(Q Kᵀ / √d_k) from the layer's own projection weights, without its forward()."""
    b, q_len, d = query.shape
    k_len, h = key_value.size(1), attn.n_heads
    d_k = d // h
    w_q, b_q = attn.q_proj.weight, attn.q_proj.bias
    w_k, b_k = attn.kv_proj.weight[:d], attn.kv_proj.bias[:d]  # keys are the first half
    q = (query @ w_q.T + b_q).view(b, q_len, h, d_k).transpose(1, 2)  # (B, H, Q, d_k)
    k = (key_value @ w_k.T + b_k).view(b, k_len, h, d_k).transpose(1, 2)  # (B, H, K, d_k)
    scores = q @ k.transpose(-2, -1) / math.sqrt(d_k)
    return scores.masked_fill(~mask, float("-inf")).softmax(-1)


def reference_maps(model: Transformer, src: Tensor, tgt_in: Tensor) -> dict[str, list[Tensor]]:
    """Every map recomputed layer by layer; each layer's input comes from running the ones
    before it, so nothing is read back from the attention modules' own weight outputs."""
    enc, dec = model.encoder, model.decoder
    keys = (src != PAD_ID)[:, None, None, :]  # (B, 1, 1, S)
    causal = torch.ones(tgt_in.size(1), tgt_in.size(1), dtype=torch.bool).tril()
    out: dict[str, list[Tensor]] = {"encoder": [], "decoder": [], "cross": []}
    x = enc.positions(enc.embedding(src))
    for layer in enc.layers:
        h = layer.norm1(x) if layer.pre_norm else x
        out["encoder"].append(by_hand(layer.self_attn, h, h, keys))
        x, _ = layer(x, keys)
    memory = enc.final_norm(x)
    y = dec.positions(dec.embedding(tgt_in))
    for layer in dec.layers:
        h = layer.norm1(y) if layer.pre_norm else y
        out["decoder"].append(by_hand(layer.self_attn, h, h, causal))
        attended, _ = layer.self_attn(h, h, causal=True)
        z = y + attended
        query = layer.norm2(z) if layer.pre_norm else layer.norm1(z)
        out["cross"].append(by_hand(layer.cross_attn, query, memory, keys))
        y, _, _ = layer(y, memory, keys)
    return out


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_maps_equal_an_independent_recomputation(norm: str) -> None:
    model = random_model(norm)
    with torch.no_grad():
        maps = model(PADDED_SRC, PADDED_TGT, need_weights=True).attentions
        expected = reference_maps(model, PADDED_SRC, PADDED_TGT)
    assert maps is not None
    for kind in ("encoder", "decoder", "cross"):
        got = getattr(maps, kind)
        assert len(got) == 2
        for mine, theirs in zip(got, expected[kind], strict=True):
            torch.testing.assert_close(mine, theirs, atol=1e-5, rtol=1e-4)


def test_inspect_attention_matches_the_trained_models_own_layers(digits: Checkpoint) -> None:
    res = inspect_attention(digits, "2 7 1 8", "two seven one eight")
    tok = digits.tokenizers
    src = torch.tensor([tok.source.encode("2 7 1 8")])
    tgt_in = torch.tensor([[1, *tok.target.encode("two seven one eight")]])
    with torch.no_grad():
        expected = reference_maps(digits.model, src, tgt_in)
    for kind in ("encoder", "decoder", "cross"):
        torch.testing.assert_close(res.maps(kind), torch.cat(expected[kind]), atol=1e-5, rtol=1e-4)


def test_inspection_changes_nothing(digits: Checkpoint) -> None:
    model = digits.model
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        plain = model(PADDED_SRC, PADDED_TGT).logits
        inspected = model(PADDED_SRC, PADDED_TGT, need_weights=True).logits
    torch.testing.assert_close(inspected, plain, atol=1e-5, rtol=1e-5)

    model.train()
    try:
        attention_maps(model, digits.tokenizers, "3 1 4")  # generates its own target
        assert model.training  # its mode is given back
    finally:
        model.eval()
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name]), name


def test_target_is_the_models_greedy_output_unless_given(digits: Checkpoint) -> None:
    res = inspect_attention(digits, "3 1 4")
    assert res.generated and res.target_text == "three one four"
    given = inspect_attention(digits, "3 1 4", "one")
    assert not given.generated and given.target_tokens[0] == "<bos>"
    assert given.cross.shape[2] == 1 + len(digits.tokenizers.target.encode("one"))


# -- selecting maps ---------------------------------------------------------------------------


def test_select_any_layer_and_head(result: AttentionResult) -> None:
    maps = result.cross  # (L, H, T, S)
    n_layers, n_heads, rows, cols = maps.shape
    assert torch.equal(result.select("cross", -1, -1), maps[n_layers - 1, n_heads - 1])
    assert torch.equal(result.select("cross", 0, "all"), maps[0])
    torch.testing.assert_close(result.select("cross", 0, "mean"), maps[0].mean(0))
    assert torch.equal(result.select("cross", "all", "all"), maps)
    assert torch.equal(result.select("cross", "all", 1), maps[:, 1])
    assert result.select("cross", "all", "mean").shape == (n_layers, rows, cols)

    chosen = result.selection("cross", -1, -1, checkpoint="ckpt")
    assert (chosen.layer, chosen.head) == (n_layers - 1, n_heads - 1)
    assert chosen.dims == ("row", "column") and chosen.checkpoint == "ckpt"
    assert result.selection("encoder", "all", "all").dims == ("layer", "head", "row", "column")
    assert result.selection("decoder", 0, "all").dims == ("head", "row", "column")


@pytest.mark.parametrize(
    ("layer", "head", "message"),
    [(7, "mean", "--layer 7 is out of range"), (-9, 0, "--layer -9 is out of range"),
     (0, 4, "--head 4 is out of range"), (0, -5, "--head -5 is out of range")],
)
def test_select_names_the_bad_flag(result: AttentionResult, layer: int, head: int | str,
                                   message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        result.select("cross", layer, head)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="--kind"):
        result.maps("self")


# -- head statistics --------------------------------------------------------------------------


def one_hot_columns(columns: list[int], n: int) -> Tensor:
    return torch.nn.functional.one_hot(torch.tensor(columns), n).float()


def test_head_statistics_tag_the_textbook_patterns() -> None:
    n = 6
    uniform = torch.full((n, n), 1 / n)
    sharp_elsewhere = one_hot_columns([3, 5, 1, 4, 0, 2], n)  # content-based: no fixed offset
    heads = {
        "diagonal": torch.eye(n),
        "previous-token": one_hot_columns([0, 0, 1, 2, 3, 4], n),
        "first-token": one_hot_columns([0] * n, n),
        "eos": one_hot_columns([n - 1] * n, n),
        "broad": uniform,
        "focused": 0.7 * sharp_elsewhere + 0.3 * uniform,
        "mixed": 0.45 * sharp_elsewhere + 0.45 * one_hot_columns([2, 3, 4, 5, 1, 0], n)
        + 0.1 * uniform,
    }
    maps = torch.stack(list(heads.values()))[None]  # (1, H, n, n)
    stats = head_statistics(maps)
    assert [s.pattern for s in stats] == list(heads)
    assert [(s.layer, s.head) for s in stats] == [(0, h) for h in range(len(heads))]
    diagonal, previous, first, eos, broad = stats[:5]
    assert diagonal.diagonal == pytest.approx(1.0) and diagonal.entropy == pytest.approx(0.0)
    assert previous.previous == pytest.approx(1.0)  # rows 1.. look one back
    assert first.first == pytest.approx(1.0) and eos.eos == pytest.approx(1.0)
    assert broad.entropy == pytest.approx(math.log(n)) and broad.spread == pytest.approx(1.0)
    assert broad.max_weight == pytest.approx(1 / n)


def test_head_statistics_of_causal_maps_skip_rows_without_a_choice() -> None:
    n = 5
    causal_uniform = torch.tril(torch.ones(n, n))
    causal_uniform /= causal_uniform.sum(-1, keepdim=True)
    stats = head_statistics(causal_uniform[None, None], causal=True)[0]
    # Row 0 sees one key and is left out; every other row spreads evenly over what it sees.
    assert stats.spread == pytest.approx(1.0)
    assert stats.pattern == "broad"
    assert stats.first == pytest.approx(sum(1 / k for k in range(2, n + 1)) / (n - 1))
    # The last key is visible to the last row only.
    assert stats.eos == pytest.approx(1 / n)


def test_eos_column_prefers_an_eos_token() -> None:
    assert eos_column(["▁3", "1", "<eos>", "<pad>"]) == 2
    assert eos_column(["▁3", "1", "4"]) == 2


def test_the_trained_models_statistics_are_well_formed(result: AttentionResult) -> None:
    stats = head_statistics(result.decoder, causal=True)
    assert len(stats) == result.decoder.shape[0] * result.decoder.shape[1]
    for s in stats:
        for share in (s.diagonal, s.previous, s.first, s.eos, s.max_weight, s.spread):
            assert 0.0 <= share <= 1.0 + 1e-6
        assert s.pattern in ("diagonal", "previous-token", "first-token", "eos", "broad",
                             "focused", "mixed")


# -- files ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("layer", "head"), [(0, 1), (-1, "mean"), (0, "all"), ("all", "all")])
@pytest.mark.parametrize("suffix", [".json", ".npz"])
def test_saved_maps_round_trip(result: AttentionResult, tmp_path: Path, suffix: str,
                               layer: int | str, head: int | str) -> None:
    chosen = result.selection("cross", layer, head, checkpoint="runs/toy/step-000600")  # type: ignore[arg-type]
    path = tmp_path / f"maps{suffix}"
    save_attention(path, chosen)
    loaded = load_attention(path)
    assert torch.equal(loaded.weights, chosen.weights)
    assert loaded.weights.dtype == torch.float32
    assert loaded == dataclasses.replace(chosen, weights=loaded.weights)  # every other field
    assert loaded.source == "3 1 4 1" and loaded.target == "three one four one"
    assert loaded.checkpoint == "runs/toy/step-000600"


def test_npz_holds_plain_arrays_only(result: AttentionResult, tmp_path: Path) -> None:
    path = tmp_path / "maps.npz"
    save_attention(path, result.selection("encoder", "all", "all", checkpoint="c"))
    with np.load(path, allow_pickle=False) as arrays:  # no object arrays anywhere
        assert set(arrays.files) == {"weights", "rows", "columns", "meta"}
        assert arrays["weights"].dtype == np.float32
        assert arrays["weights"].shape == tuple(result.encoder.shape)
        assert arrays["rows"].dtype.kind == "U" and list(arrays["rows"]) == result.source_tokens
        meta = json.loads(str(arrays["meta"][0]))
    assert meta["dims"] == ["layer", "head", "row", "column"]
    assert meta["kind"] == "encoder" and meta["source"] == "3 1 4 1"


def test_loading_a_foreign_file_is_a_clear_error(tmp_path: Path) -> None:
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"weights": [[1.0]]}), encoding="utf-8")
    with pytest.raises(DataError, match="not a tformer-attention file"):
        load_attention(other)
    with pytest.raises(DataError, match="cannot read"):
        load_attention(tmp_path / "missing.npz")
    maps = torch.full((1, 1, 2, 2), 0.5)
    tiny = AttentionResult(maps, maps, maps, ["a", "b"], ["<bos>", "c"], "a b", "c", False)
    with pytest.raises(ConfigError, match="--save"):
        save_attention(tmp_path / "maps.csv", tiny.selection("encoder", 0, 0))


# -- alignment on the bundled date task -------------------------------------------------------

def test_dates_recipe_meets_the_quick_start_target_in_a_fixed_number_of_steps(
    date_run: TrainResult, date_model: Checkpoint
) -> None:
    # The quick start trains this recipe for 150 s, about 2,200 steps on a 2-core EPYC; the
    # target (>= 95% exact match on the test split) must hold well before that, whatever the
    # machine's speed. Training reports the validation split; the test split is measured here.
    assert date_run.step == ALIGNMENT_STEPS and date_run.exact_match_split == "validation"
    assert date_run.exact_match is not None
    tokenizers = date_model.tokenizers
    test = encode_pairs(load_text_pairs(date_model.train_config.data)["test"], tokenizers.source,
                        tokenizers.target, date_model.model_config.max_len)  # fmt: skip
    hits = exact_match(date_run.model, test, tokenizers)[0]
    print(f"dates recipe: {hits:.1%} exact match after {date_run.step} steps")
    assert hits >= 0.95, f"{hits:.1%} after {date_run.step} steps"


def test_cross_attention_aligns_year_digits_on_the_date_task(date_model: Checkpoint) -> None:
    tok = date_model.tokenizers
    n_layers = date_model.model_config.n_decoder_layers
    on_year = torch.zeros(n_layers)  # argmax is one of the source's year digits
    on_digit = torch.zeros(n_layers)  # argmax is the very digit being written
    rows_seen = 0
    for pair in numeric_dates(30):
        source, target = pair["source"], pair["target"]
        src_offsets = tok.source.inner.encode(source, add_special_tokens=False).offsets
        tgt_offsets = tok.target.inner.encode(target, add_special_tokens=False).offsets
        start = source.index(target[:4])
        year_cols = [token_at(src_offsets, start + k) for k in range(4)]
        # Row i of a cross map predicts target token i (row 0 reads <bos>).
        year_rows = [token_at(tgt_offsets, k) for k in range(4)]
        mean_over_heads = inspect_attention(date_model, source, target).cross.mean(1)
        for row, col in zip(year_rows, year_cols, strict=True):
            strongest = mean_over_heads[:, row].argmax(-1)  # (L,)
            on_year += torch.tensor([int(c) in year_cols for c in strongest]).float()
            on_digit += (strongest == col).float()
            rows_seen += 1
    best = int(on_year.argmax())
    year_share, digit_share = on_year[best] / rows_seen, on_digit[best] / rows_seen
    print(f"year-digit rows on year digits per layer: {(on_year / rows_seen).tolist()}, "
          f"on the same digit: {(on_digit / rows_seen).tolist()}")
    # Measured 0.81 / 0.71 (layer 1, 120 rows); chance is about 0.4 / 0.1 for these sources
    # of 9-11 tokens.
    assert year_share >= 0.65
    assert digit_share >= 0.4


def test_inspect_attention_takes_a_checkpoint_as_generate_does(digits: Checkpoint) -> None:
    new = inspect_attention(digits, "3 1 4", "three one four")
    with pytest.warns(DeprecationWarning, match="inspect_attention\\(ckpt, source"):
        old = inspect_attention(digits.model, digits.tokenizers, "3 1 4", "three one four")
    core = attention_maps(digits.model, digits.tokenizers, "3 1 4", "three one four")
    for kind in ("encoder", "decoder", "cross"):
        torch.testing.assert_close(new.maps(kind), old.maps(kind))
        torch.testing.assert_close(new.maps(kind), core.maps(kind))
    assert new.target_text == old.target_text == "three one four"


def test_decoder_rows_are_labelled_by_the_token_they_predict(digits: Checkpoint) -> None:
    res = inspect_attention(digits, "3 1 4")  # greedy: each row's argmax is the next token
    tok = digits.tokenizers.target
    tgt_in = [1, *tok.encode(res.target_text)]
    with torch.no_grad():
        src = torch.tensor([digits.tokenizers.source.encode("3 1 4")])
        logits = digits.model(src, torch.tensor([tgt_in])).logits[0]
    argmax = tok.tokens(logits.argmax(-1).tolist())
    for kind in ("decoder", "cross"):
        selection = res.selection(kind, -1, "mean")
        assert selection.rows == argmax == res.predicted_tokens
        assert selection.rows[-1] == "<eos>" and selection.rows[:-1] == res.target_tokens[1:]
    assert res.selection("decoder", 0, 0).columns == res.target_tokens  # what each row reads
