"""Training: the loss, the schedule, learning for real, and exact resume."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from tests.conftest import tiny_model
from tformer.checkpoint.store import load_checkpoint
from tformer.config import PAD_ID, ModelConfig, TrainConfig
from tformer.data.pairs import encode_pairs
from tformer.data.sources import load_text_pairs
from tformer.training.loss import sequence_loss
from tformer.training.optim import cosine_lr, inverse_sqrt_lr, lr_at
from tformer.training.run import TrainResult, train
from tformer.training.validation import exact_match


def test_loss_ignores_padding() -> None:
    torch.manual_seed(0)
    logits = torch.randn(2, 4, 10)
    labels = torch.tensor([[5, 6, 2, PAD_ID], [7, 2, PAD_ID, PAD_ID]])
    total = sequence_loss(logits, labels)
    # By hand: mean over the five real positions only.
    real = [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)]
    by_hand = sum(-F.log_softmax(logits[b, t], -1)[labels[b, t]] for b, t in real)
    torch.testing.assert_close(total, by_hand)
    # Whatever the logits at padded positions, the loss does not move.
    changed = logits.clone()
    changed[0, 3] += 100
    changed[1, 2:] -= 50
    torch.testing.assert_close(sequence_loss(changed, labels), total)


def test_label_smoothing_matches_torch() -> None:
    logits = torch.randn(3, 5, 12)
    labels = torch.randint(1, 12, (3, 5))
    labels[0, 3:] = PAD_ID
    mask = labels != PAD_ID
    reference = F.cross_entropy(logits[mask], labels[mask], label_smoothing=0.1,
                                reduction="sum")
    torch.testing.assert_close(sequence_loss(logits, labels, 0.1), reference)


def test_inverse_sqrt_schedule_is_the_papers_formula() -> None:
    d_model, warmup = 512, 4000
    config = TrainConfig(warmup_steps=warmup)
    model = ModelConfig(d_model=d_model)
    for step in (1, 100, 4000, 4001, 10000, 100000):
        paper = d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)
        assert lr_at(step, model, config) == pytest.approx(paper, rel=1e-12)
    assert inverse_sqrt_lr(4000, 1.0, 4000) == pytest.approx(1.0)


def test_cosine_schedule_warms_up_then_decays_to_the_floor() -> None:
    assert cosine_lr(50, 1.0, 100, 1000) == pytest.approx(0.5)
    assert cosine_lr(100, 1.0, 100, 1000) == pytest.approx(1.0)
    assert cosine_lr(550, 1.0, 100, 1000) == pytest.approx(0.5)
    assert cosine_lr(1000, 1.0, 100, 1000, floor=0.1) == pytest.approx(0.1)


def test_linear_and_cosine_decay_by_steps_or_by_the_time_budget() -> None:
    model = ModelConfig(d_model=64)
    linear = TrainConfig(lr=1.0, warmup_steps=100, schedule="linear", min_lr=0.1)
    assert lr_at(50, model, linear, total_steps=1000) == pytest.approx(0.5)  # warm-up
    assert lr_at(550, model, linear, total_steps=1000) == pytest.approx(0.55)  # half-way down
    assert lr_at(1000, model, linear, total_steps=1000) == pytest.approx(0.1)
    # Time: at step 200 with half the budget used, warm-up ended a quarter of the way in, so
    # the decay is (0.5 - 0.25) / (1 - 0.25) = 1/3 done.
    assert lr_at(200, model, linear, time_fraction=0.5) == pytest.approx(1.0 - 0.9 / 3)
    assert lr_at(200, model, linear, time_fraction=1.0) == pytest.approx(0.1)
    assert lr_at(100, model, linear, time_fraction=0.9) == pytest.approx(1.0)  # still warming
    # With both limits the one nearer its end sets the pace.
    assert lr_at(550, model, linear, 1000, time_fraction=0.2) == pytest.approx(0.55)
    assert lr_at(200, model, linear, 10**6, time_fraction=0.5) == pytest.approx(1.0 - 0.9 / 3)
    cosine = TrainConfig(lr=1.0, warmup_steps=100, schedule="cosine")
    assert lr_at(200, model, cosine, time_fraction=0.5) == pytest.approx(
        0.5 * (1 + math.cos(math.pi / 3))
    )
    with pytest.raises(ValueError, match="step or time limit"):
        lr_at(200, model, cosine)


@pytest.mark.slow
def test_a_linear_decay_reaches_its_floor_when_the_time_budget_ends(
    toy_data: Path, tmp_path: Path
) -> None:
    config = TrainConfig(data=str(toy_data), max_tokens=512, lr=2e-3, warmup_steps=5,
                         schedule="linear", time_budget=4.0, log_every=1, eval_every=10_000,
                         save_every=10_000)
    train(tiny_model(), config, out=tmp_path / "decay", vocab_size=64)
    records = [json.loads(line) for line in (tmp_path / "decay" / "metrics.jsonl").read_text()
               .splitlines()]
    logged = [r for r in records if "lr" in r]
    assert logged[-1]["elapsed"] >= 4.0
    lrs = [r["lr"] for r in logged if r["step"] > 5]
    assert len(lrs) >= 3 and lrs[-1] < lrs[0]
    assert all(b <= a for a, b in zip(lrs, lrs[1:], strict=False))  # only ever down
    # Step s starts with the time used by step s - 1 (logged, rounded to 10 ms) and takes
    # the rate of that share of the budget: peak * (1 - progress).
    for before, record in zip(logged, logged[1:], strict=False):
        if record["step"] <= 5:
            continue
        fraction = before["elapsed"] / 4.0
        warmup_fraction = fraction * 5 / record["step"]
        progress = (fraction - warmup_fraction) / (1 - warmup_fraction)
        assert record["lr"] == pytest.approx(2e-3 * (1 - progress), abs=2e-3 * 0.01)


def test_a_tiny_model_learns_a_simple_mapping(trained: TrainResult, toy_data: Path) -> None:
    """Held-out digit strings -> words: the seeded run must reach >= 95% exact match."""
    assert trained.exact_match is not None and trained.exact_match >= 0.95
    assert trained.exact_match_split == "validation"
    # The test split is no longer decoded by training; measure it here, as before.
    saved = load_checkpoint(trained.run_dir)
    test = encode_pairs(load_text_pairs(str(toy_data))["test"], saved.tokenizers.source,
                        saved.tokenizers.target, saved.model_config.max_len)
    assert exact_match(saved.model, test, saved.tokenizers)[0] >= 0.95
    records = [json.loads(line) for line in (trained.run_dir / "metrics.jsonl").read_text()
               .splitlines()]
    assert not any(key.startswith("test") for record in records for key in record)
    assert trained.val_loss is not None and trained.val_loss < 0.1


def _losses(run: Path) -> dict[int, float]:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in records if "loss" in r}


@pytest.mark.slow
def test_resume_follows_the_uninterrupted_trajectory(toy_data: Path, tmp_path: Path) -> None:
    def config(max_steps: int) -> TrainConfig:
        return TrainConfig(data=str(toy_data), max_tokens=512, lr=2e-3, warmup_steps=10,
                           max_steps=max_steps, log_every=5, eval_every=100, save_every=10,
                           seed=3)

    model = tiny_model()
    straight = train(model, config(20), out=tmp_path / "straight", vocab_size=64)
    first = train(model, config(10), out=tmp_path / "split", vocab_size=64)
    assert first.step == 10
    # The recorded metrics of the first half would be rewritten; keep them to compare.
    resumed = train(None, config(20), out=tmp_path / "split", resume=True)
    assert resumed.step == 20
    a, b = _losses(tmp_path / "straight"), _losses(tmp_path / "split")
    for step in (5, 10, 15, 20):
        assert a[step] == b[step], step  # bit for bit on CPU
    wa = load_checkpoint(straight.run_dir).model.state_dict()
    wb = load_checkpoint(resumed.run_dir).model.state_dict()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.slow
def test_time_budget_stops_training(toy_data: Path, tmp_path: Path) -> None:
    config = TrainConfig(data=str(toy_data), max_tokens=512, time_budget=2.0, log_every=10,
                         eval_every=10_000, save_every=10_000)
    result = train(tiny_model(), config, out=tmp_path / "timed", vocab_size=64)
    assert 2.0 <= result.elapsed < 20
    assert math.isfinite(result.train_loss or float("nan"))


def test_gradient_accumulation_equals_a_bigger_batch(toy_data: Path, tmp_path: Path) -> None:
    """Two accumulated half-batches give the same update as the two batches at once."""
    from tformer.data.batching import collate
    from tformer.model import Transformer

    torch.manual_seed(0)
    model = Transformer(ModelConfig(src_vocab_size=30, tgt_vocab_size=30, d_model=16, n_heads=2,
                                    n_encoder_layers=1, n_decoder_layers=1, d_ff=32,
                                    dropout=0.0))
    pairs = [([4, 5, 6], [7, 8]), ([9, 10], [11, 12, 13]), ([14], [15]), ([16, 17], [18])]
    full = collate(pairs)
    loss = sequence_loss(model(full.src, full.tgt_in).logits, full.tgt_out)
    grads_full = torch.autograd.grad(loss / full.n_target_tokens, list(model.parameters()))
    total_tokens = full.n_target_tokens
    acc = [torch.zeros_like(p) for p in model.parameters()]
    for part in (pairs[:2], pairs[2:]):
        b = collate(part)
        part_loss = sequence_loss(model(b.src, b.tgt_in).logits, b.tgt_out) / total_tokens
        for a, g in zip(acc, torch.autograd.grad(part_loss, list(model.parameters())),
                        strict=True):
            a += g
    for a, g in zip(acc, grads_full, strict=True):
        torch.testing.assert_close(a, g, atol=1e-6, rtol=1e-5)


def test_refuses_to_resume_nothing(tmp_path: Path) -> None:
    from tformer.errors import CheckpointError

    with pytest.raises(CheckpointError, match="no tformer run"):
        train(None, TrainConfig(), out=tmp_path / "nothing", resume=True)
    shutil.rmtree(tmp_path, ignore_errors=True)


def test_adam_on_the_cpu_updates_in_fused_kernels_as_foreach_does() -> None:
    from tformer.config import ModelConfig, TrainConfig
    from tformer.model import Transformer
    from tformer.training.optim import build_optimizer

    torch.manual_seed(0)
    config = ModelConfig(src_vocab_size=50, tgt_vocab_size=50, d_model=32, n_heads=2,
                         n_encoder_layers=1, n_decoder_layers=1, d_ff=64, dropout=0.0)  # fmt: skip
    for decay in (0.0, 0.01):
        fused_model, foreach_model = Transformer(config), Transformer(config)
        foreach_model.load_state_dict(fused_model.state_dict())
        fused = build_optimizer(fused_model, TrainConfig(weight_decay=decay))
        assert type(fused) is (torch.optim.AdamW if decay else torch.optim.Adam)
        assert fused.defaults["fused"] is True and not fused.defaults["foreach"]
        assert fused.defaults["betas"] == (0.9, 0.98) and fused.defaults["eps"] == 1e-9
        foreach = type(fused)(foreach_model.parameters(), betas=(0.9, 0.98), eps=1e-9,
                              weight_decay=decay, foreach=True)  # fmt: skip
        for optimizer in (fused, foreach):
            for group in optimizer.param_groups:
                group["lr"] = 1e-3
        before = {name: p.detach().clone() for name, p in fused_model.named_parameters()}
        for _ in range(5):  # the same gradients for both
            for a, b in zip(fused_model.parameters(), foreach_model.parameters(), strict=True):
                a.grad = torch.randn_like(a)
                b.grad = a.grad.clone()
            versions = [p._version for p in fused_model.parameters()]
            fused.step()
            foreach.step()
            # Each update is counted as a change of its weight, as foreach's are: the decoding
            # caches that validation uses are remade from the new weights.
            assert all(p._version > v for p, v in zip(fused_model.parameters(), versions,
                                                      strict=True))  # fmt: skip
        for (name, a), b in zip(fused_model.named_parameters(), foreach_model.parameters(),
                                strict=True):  # fmt: skip
            assert not torch.equal(a, before[name]), name
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)


def test_adam_on_mixed_devices_updates_with_foreach_kernels() -> None:
    from tformer.training.optim import update_kernels

    params = [torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(2, device="meta"))]
    assert update_kernels(params) == {"foreach": True}
    assert update_kernels(params[:1]) == {"fused": True}


