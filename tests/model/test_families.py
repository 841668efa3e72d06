"""Decoder-only and encoder-only models: their masks, torch's own layers as the reference,
cached against uncached generation, and the batches of their two objectives."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tformer.config import BOS_ID, EOS_ID, MASK_ID, PAD_ID, SPECIAL_TOKENS, ModelConfig
from tformer.data.batching import BatchPlan, example_key
from tformer.data.lm import CausalObjective, MaskedObjective, causal_examples, masked_examples
from tformer.decoding.api import decode
from tformer.decoding.settings import DecodingConfig
from tformer.model import DecoderOnlyTransformer, EncoderOnlyTransformer, build_model
from tformer.model.positions import sinusoidal_positions
from tformer.training.loss import sequence_loss

VOCAB = 40


def config(arch: str, **overrides: object) -> ModelConfig:
    values: dict[str, object] = dict(
        arch=arch, src_vocab_size=VOCAB, tgt_vocab_size=VOCAB, d_model=32, n_heads=4,
        n_encoder_layers=2, n_decoder_layers=2, d_ff=64, dropout=0.0, max_len=24,
    )
    values.update(overrides)
    return ModelConfig(**values)  # type: ignore[arg-type]


def test_build_model_gives_each_family_only_its_stack() -> None:
    gpt, bert = build_model(config("decoder-only")), build_model(config("encoder-only"))
    assert isinstance(gpt, DecoderOnlyTransformer) and not hasattr(gpt, "encoder")
    assert isinstance(bert, EncoderOnlyTransformer) and not hasattr(bert, "decoder")
    assert all(not hasattr(layer, "cross_attn") for layer in gpt.decoder.layers)
    # Parameter counts add up, and the tied output projection is counted once.
    for model in (gpt, bert):
        counts = model.parameter_counts()
        assert counts["total"] == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("positions", ["sinusoidal", "learned", "rope"])
def test_no_position_of_a_decoder_only_model_sees_a_later_one(positions: str) -> None:
    torch.manual_seed(0)
    model = build_model(config("decoder-only", positions=positions)).eval()
    ids = torch.randint(5, VOCAB, (1, 12))
    before = model(ids, ids).logits
    for j in (3, 7, 11):
        changed = ids.clone()
        changed[0, j] = (changed[0, j] + 1 - 5) % (VOCAB - 5) + 5
        after = model(changed, changed).logits
        torch.testing.assert_close(after[:, :j], before[:, :j])  # earlier: untouched
        assert not torch.allclose(after[:, j:], before[:, j:])  # from j on: it matters


def test_an_encoder_only_model_reads_both_ways_and_ignores_padding() -> None:
    torch.manual_seed(0)
    model = build_model(config("encoder-only")).eval()
    ids = torch.randint(5, VOCAB, (1, 10))
    base = model(ids).logits
    changed = ids.clone()
    changed[0, 9] = 5 if ids[0, 9] != 5 else 6
    assert not torch.allclose(model(changed).logits[:, 0], base[:, 0])  # a later token counts
    padded = torch.cat([ids, torch.full((1, 4), PAD_ID)], dim=1)
    torch.testing.assert_close(model(padded).logits[:, :10], base, atol=1e-5, rtol=1e-5)


def _copy_into_torch_layer(ours: torch.nn.Module, theirs: torch.nn.TransformerEncoderLayer) -> None:
    attention = ours.self_attn
    k, v = attention.kv_proj.weight.chunk(2), attention.kv_proj.bias.chunk(2)
    with torch.no_grad():
        theirs.self_attn.in_proj_weight.copy_(torch.cat([attention.q_proj.weight, *k]))
        theirs.self_attn.in_proj_bias.copy_(torch.cat([attention.q_proj.bias, *v]))
        theirs.self_attn.out_proj.weight.copy_(attention.out_proj.weight)
        theirs.self_attn.out_proj.bias.copy_(attention.out_proj.bias)
        theirs.linear1.load_state_dict(ours.feed_forward.w1.state_dict())
        theirs.linear2.load_state_dict(ours.feed_forward.w2.state_dict())
        theirs.norm1.load_state_dict(ours.norm1.state_dict())
        # the decoder block keeps the paper's names: its feed-forward norm is norm3
        last = ours.norm3 if hasattr(ours, "norm3") else ours.norm2
        theirs.norm2.load_state_dict(last.state_dict())


@pytest.mark.parametrize("arch", ["decoder-only", "encoder-only"])
@pytest.mark.parametrize("norm", ["post", "pre"])
def test_each_family_equals_torch_encoder_layers_with_copied_weights(arch: str, norm: str) -> None:
    """A GPT block is torch's encoder layer under a causal mask; a BERT block is one without."""
    torch.manual_seed(0)
    cfg = config(arch, norm=norm)
    model = build_model(cfg).eval()
    stack = model.decoder if arch == "decoder-only" else model.encoder
    reference = []
    for layer in stack.layers:
        theirs = torch.nn.TransformerEncoderLayer(
            cfg.d_model, cfg.n_heads, cfg.d_ff, dropout=0.0, batch_first=True,
            norm_first=norm == "pre",
        ).eval()
        _copy_into_torch_layer(layer, theirs)
        reference.append(theirs)
    ids = torch.randint(5, VOCAB, (2, 9))
    x = stack.embedding.weight[ids] * math.sqrt(cfg.d_model) + sinusoidal_positions(9, 32)
    mask = torch.nn.Transformer.generate_square_subsequent_mask(9)
    for theirs in reference:
        x = theirs(x, src_mask=mask if arch == "decoder-only" else None)
    if norm == "pre":
        x = stack.final_norm(x)
    want = x @ stack.embedding.weight.T  # the tied output projection
    torch.testing.assert_close(model(ids, ids).logits, want, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize(
    "variant",
    [{}, {"positions": "rope"}, {"positions": "learned"}, {"kv_heads": 1},
     {"activation": "swiglu", "normalization": "rmsnorm", "norm": "pre"}],
    ids=["paper", "rope", "learned", "mqa", "swiglu-rmsnorm-pre"],
)
@pytest.mark.parametrize("strategy", ["greedy", "sample", "beam"])
def test_cached_generation_equals_recomputing_every_step(variant: dict, strategy: str) -> None:
    torch.manual_seed(1)
    model = build_model(config("decoder-only", **variant)).eval()
    settings = {"greedy": {}, "sample": {"temperature": 0.9, "seed": 3, "num_samples": 2},
                "beam": {"beam_size": 3, "n_best": 2}}[strategy]
    prompts = torch.tensor([[7, 8, 9], [10, 11, 12]])
    cached = decode(model, prompts, DecodingConfig(max_new_tokens=10, **settings))
    plain = decode(model, prompts, DecodingConfig(max_new_tokens=10, use_cache=False, **settings))
    for got, want in zip(cached, plain, strict=True):
        assert [h.ids for h in got] == [h.ids for h in want]
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g.token_logprobs, w.token_logprobs, atol=1e-4)


def test_prompts_of_different_lengths_decode_as_each_alone() -> None:
    torch.manual_seed(2)
    model = build_model(config("decoder-only")).eval()
    rows = [[7, 8, 9, 10], [11], [], [12, 13]]
    width = max(map(len, rows))
    batch = torch.tensor([r + [PAD_ID] * (width - len(r)) for r in rows])
    together = decode(model, batch, DecodingConfig(max_new_tokens=6))
    for row, got in zip(rows, together, strict=True):
        one = torch.tensor([row], dtype=torch.long)
        alone = decode(model, one, DecodingConfig(max_new_tokens=6))
        assert got[0].ids == alone[0][0].ids


def test_a_prompt_never_runs_past_the_positions_the_model_has() -> None:
    model = build_model(config("decoder-only", max_len=8, positions="learned")).eval()
    for length in (0, 5, 7, 20):
        prompt = torch.randint(5, VOCAB, (1, length))
        (hyps,) = decode(model, prompt, DecodingConfig(max_new_tokens=50, min_new_tokens=50))
        assert 1 <= len(hyps[0].token_logprobs) <= 8 - min(length, 7)


def test_packed_causal_blocks_predict_every_token_of_the_stream_once() -> None:
    docs = [[5, 6, 7], [8], [9, 10, 11, 12, 13], [14, 15]]
    stream = [i for d in docs for i in (BOS_ID, *d, EOS_ID)]
    batch = CausalObjective().collate(causal_examples(docs, 4, pack=True), [0] * 99)
    labels = [int(t) for row in batch.tgt_out for t in row if t != PAD_ID]
    assert labels == stream[1:]
    inputs = [int(t) for row in batch.tgt_in for t in row if t != PAD_ID]
    assert inputs == stream[:-1]
    assert batch.tgt_in.size(1) <= 4 and batch.src.shape == (len(batch.tgt_in), 0)
    # unpacked: one document a row, <bos> doc -> doc <eos>, cut at max_len
    rows = causal_examples(docs, 4, pack=False)
    assert rows[0][1] == [BOS_ID, 5, 6, 7, EOS_ID] and rows[2][1] == [BOS_ID, 9, 10, 11, 12]
    assert [len(x) for x, _ in masked_examples(docs, 4, pack=True)] == [4, 4, 4, 3]


def test_without_document_bos_documents_are_joined_by_eos_alone() -> None:
    """GPT-2's framing: <|endoftext|> (tformer's <eos>) ends each document and starts the
    next; only the text's first document has <bos>."""
    docs = [[5, 6, 7], [8], [9, 10, 11, 12, 13]]
    stream = [BOS_ID, 5, 6, 7, EOS_ID, 8, EOS_ID, 9, 10, 11, 12, 13, EOS_ID]
    examples = causal_examples(docs, 4, pack=True, document_bos=False)
    batch = CausalObjective().collate(examples, [0] * 99)
    assert [int(t) for row in batch.tgt_out for t in row if t != PAD_ID] == stream[1:]
    assert [int(t) for row in batch.tgt_in for t in row if t != PAD_ID] == stream[:-1]
    # unpacked, each document is a row of its own and starts with <bos> as before
    assert causal_examples(docs, 4, pack=False, document_bos=False)[1][1] == [BOS_ID, 8, EOS_ID]


def test_masking_follows_the_stated_proportions_and_never_touches_special_tokens() -> None:
    rng = np.random.default_rng(0)
    vocab = 200
    objective = MaskedObjective(vocab, seed=5)
    n_special = len(SPECIAL_TOKENS) + 1
    chosen = masked = randomised = kept = seen = 0
    for key in range(400):
        ids = rng.integers(n_special, vocab, size=500).tolist()
        ids[::50] = [EOS_ID] * 10  # special tokens among them
        inputs, labels = objective.draw(ids, key)
        # The count the loss is normalised by, drawn on its own, is the labels' count.
        assert objective.predicted((ids, []), key) == sum(label != PAD_ID for label in labels)
        for original, given, label in zip(ids, inputs, labels, strict=True):
            if original < n_special:
                assert given == original and label == PAD_ID  # never chosen
                continue
            seen += 1
            if label == PAD_ID:
                assert given == original  # not chosen: unchanged and no label
                continue
            assert label == original
            chosen += 1
            if given == MASK_ID:
                masked += 1
            elif given == original:
                kept += 1
            else:
                randomised += 1
                assert given >= n_special  # a random token is never a special one
    # Binomial proportions within 5 standard deviations (fixed seed, so this never flakes).
    for count, total, p in ((chosen, seen, 0.15), (masked, chosen, 0.8),
                            (randomised, chosen, 0.1 * (1 - 1 / (vocab - n_special))),
                            (kept, chosen, 0.1)):
        sd = math.sqrt(p * (1 - p) / total)
        assert abs(count / total - p) < 5 * sd + 1e-3, (count, total, p)


def test_masking_is_a_pure_function_of_seed_epoch_and_example() -> None:
    pairs = [(list(range(5, 30)), []) for _ in range(6)]
    plan = BatchPlan(pairs, 100, seed=0, objective=MaskedObjective(40, seed=1))
    first, again = plan.collate([0, 1, 2], epoch=0), plan.collate([0, 1, 2], epoch=0)
    assert torch.equal(first.src, again.src) and torch.equal(first.tgt_out, again.tgt_out)
    other_epoch = plan.collate([0, 1, 2], epoch=1)
    assert not torch.equal(first.tgt_out, other_epoch.tgt_out)  # fresh masks each epoch
    assert plan.target_tokens([0, 1, 2], 0) == int((first.tgt_out != PAD_ID).sum())
    assert example_key(1, 2) != example_key(2, 1)
    # every row has at least one label, even a short one
    short = MaskedObjective(40, seed=0).draw([7], 0)
    assert short[1] == [7] and MaskedObjective(40, seed=0).predicted(([7], []), 0) == 1


def test_the_loss_counts_only_the_masked_positions() -> None:
    torch.manual_seed(0)
    model = build_model(config("encoder-only"))
    objective = MaskedObjective(VOCAB, seed=0)
    pairs = [(torch.randint(5, VOCAB, (16,)).tolist(), []) for _ in range(3)]
    batch = objective.collate(pairs, [0, 1, 2])
    logits = model(batch.src).logits
    labelled = batch.tgt_out != PAD_ID
    want = F.cross_entropy(logits[labelled], batch.tgt_out[labelled], reduction="sum")
    loss = sequence_loss(logits, batch.tgt_out)
    torch.testing.assert_close(loss, want)
    (grad,) = torch.autograd.grad(loss, logits)
    assert grad[~labelled].abs().max() == 0 and grad[labelled].abs().max() > 0
