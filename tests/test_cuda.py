"""The CUDA paths against the CPU / fp32 reference: fused attention, autocast bf16 and fp16 (with
the grad scaler), torch.compile, cached decoding, sampling, the CLI and resume on a GPU.

Every test here needs a CUDA GPU and is skipped, with that reason, on a machine without one; the
same behaviours are tested on the CPU elsewhere (test_precision, test_decoding, test_cli...).

Tolerances: fp32 on the GPU agrees with the CPU to float rounding (TF32 is off, torch's
default for matmuls), 1e-4 on logits of a tiny model. bf16 keeps 8 bits of mantissa, fp16 11:
a forward pass through a few layers agrees with fp32 to a few hundredths (bf16) or thousandths
(fp16); loss trajectories over a few steps to a few percent.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from typer.testing import CliRunner

from tests.cli.test_cli import TINY
from tests.conftest import same_hypotheses
from tests.training.test_precision import _train as train_losses
from tformer.checkpoint.files import WEIGHTS
from tformer.checkpoint.run_dir import resolve
from tformer.checkpoint.store import load_checkpoint
from tformer.cli.commands import app
from tformer.config import ModelConfig
from tformer.decoding.api import decode
from tformer.decoding.settings import DecodingConfig
from tformer.model import Transformer
from tformer.training.precision import resolve_precision
from tformer.training.run import TrainResult

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA GPU on this machine: the CUDA paths need one"
)

CUDA = torch.device("cuda")
runner = CliRunner()


def random_model(seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    config = ModelConfig(
        src_vocab_size=300, tgt_vocab_size=300, d_model=64, n_heads=4, n_encoder_layers=2,
        n_decoder_layers=2, d_ff=128, dropout=0.0,
    )  # fmt: skip
    return Transformer(config).eval()


def batch(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, 300, (3, 11), generator=g)
    src[1, 7:] = 0  # padding: the encoder's mask must hold on the GPU too
    return src, torch.randint(4, 300, (3, 9), generator=g)


def test_fp32_forward_on_the_gpu_matches_the_cpu() -> None:
    model = random_model()
    src, tgt = batch()
    with torch.no_grad():
        cpu = model(src, tgt).logits
        gpu_model = random_model().to(CUDA)
        fused = gpu_model(src.to(CUDA), tgt.to(CUDA)).logits
        # need_weights takes the explicit softmax(QK^T/sqrt(d_k))V path instead of SDPA.
        explicit = gpu_model(src.to(CUDA), tgt.to(CUDA), need_weights=True)
    torch.testing.assert_close(fused.cpu(), cpu, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(explicit.logits.cpu(), cpu, atol=1e-4, rtol=1e-4)
    assert explicit.attentions is not None
    cross = explicit.attentions.cross[0]  # (B, h, T, S): padded source positions get no weight
    assert float(cross[1, :, :, 7:].abs().max()) == 0.0
    torch.testing.assert_close(cross.sum(-1), torch.ones_like(cross.sum(-1)))


@pytest.mark.parametrize(("name", "atol"), [("bf16", 0.08), ("fp16", 0.01)])
def test_autocast_forward_on_the_gpu_matches_fp32(name: str, atol: float) -> None:
    if name == "bf16" and not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has no bf16")
    model = random_model().to(CUDA)
    src, tgt = (t.to(CUDA) for t in batch())
    precision = resolve_precision(name, CUDA)
    assert precision.needs_scaler == (name == "fp16")  # fp16 needs loss scaling, bf16 not
    with torch.no_grad():
        reference = model(src, tgt).logits
        with precision.autocast():
            fast = model(src, tgt).logits
    assert fast.dtype == precision.dtype  # it really ran in reduced precision
    torch.testing.assert_close(fast.float(), reference, atol=atol, rtol=0.05)
    assert (fast.argmax(-1) == reference.argmax(-1)).float().mean() > 0.95


def test_auto_precision_on_the_gpu() -> None:
    want = "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    assert resolve_precision("auto", CUDA).name == want


def _train(data: Path, out: Path, **overrides: object) -> list[float]:
    """test_precision's short run (its losses at each log), on the GPU unless told otherwise."""
    return train_losses(data, out, **{"device": "cuda", **overrides})


def _weights(run: Path) -> dict[str, torch.Tensor]:
    with safe_open(str(resolve(run) / WEIGHTS), "pt") as handle:
        return {k: handle.get_tensor(k) for k in handle.keys()}


@pytest.mark.parametrize("name", ["bf16", "fp16"])
def test_mixed_precision_training_on_the_gpu_follows_fp32(
    name: str, toy_data: Path, tmp_path: Path
) -> None:
    if name == "bf16" and not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has no bf16")
    fp32 = _train(toy_data, tmp_path / "fp32", precision="fp32")
    mixed = _train(toy_data, tmp_path / name, precision=name)
    assert len(fp32) == len(mixed) == 4
    assert mixed[-1] < mixed[0] * 0.8  # it learns
    for a, b in zip(fp32, mixed, strict=True):
        assert abs(a - b) / a < 0.05, (fp32, mixed)
    weights = _weights(tmp_path / name)
    # Weights stay fp32 and finite whatever the compute precision (the scaler unscales fp16).
    assert {w.dtype for w in weights.values()} == {torch.float32}
    assert all(torch.isfinite(w).all() for w in weights.values())


def test_the_same_run_on_the_gpu_follows_the_cpu(toy_data: Path, tmp_path: Path) -> None:
    gpu = _train(toy_data, tmp_path / "gpu", precision="fp32")
    cpu = _train(toy_data, tmp_path / "cpu", precision="fp32", device="cpu")
    # Same seed, same data order, no dropout: only the order of float sums differs.
    for a, b in zip(cpu, gpu, strict=True):
        assert abs(a - b) / a < 0.1, (cpu, gpu)


def test_compiled_training_on_the_gpu_matches_eager(toy_data: Path, tmp_path: Path) -> None:
    pytest.importorskip("triton")
    eager = _train(toy_data, tmp_path / "eager", precision="fp32")
    compiled = _train(toy_data, tmp_path / "compiled", precision="fp32", compile=True)
    for a, b in zip(eager, compiled, strict=True):
        assert abs(a - b) < 2e-3 * a, (eager, compiled)
    names = list(_weights(tmp_path / "compiled"))
    assert names and not any("_orig_mod" in n or n.startswith("module.") for n in names)
    load_checkpoint(tmp_path / "compiled")  # loads into a plain model
    mixed = _train(toy_data, tmp_path / "compiled-mixed", precision="auto", compile=True)
    assert mixed[-1] < mixed[0] * 0.8


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_loss_on_the_gpu_matches_torch(dtype: torch.dtype) -> None:
    # What training with --compile uses on a GPU: the loss compiled into fused kernels.
    from torch._dynamo.utils import counters

    from tests.training.test_loss import loss_and_grad, reference
    from tformer.training.loss import fusable, sequence_loss

    assert fusable(CUDA)
    torch.manual_seed(0)
    compiled = []
    for rows in (37, 250):  # two shapes, one compilation
        logits = (torch.randn(4, rows, 5003, device=CUDA) * 3).to(dtype)
        labels = torch.randint(1, 5003, (4, rows), device=CUDA)
        labels[0, rows // 2 :] = 0
        fused = lambda x, y, s: sequence_loss(x, y, s, fused=True)  # noqa: E731
        ours, our_grad = loss_and_grad(fused, logits, labels, 0.1, 1e-3)
        ref, ref_grad = loss_and_grad(reference, logits, labels, 0.1, 1e-3)
        torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-2)
        assert our_grad.dtype == dtype
        torch.testing.assert_close(our_grad.float(), ref_grad.float(), rtol=1e-2, atol=1e-6)
        compiled.append(counters["stats"]["unique_graphs"])
    assert compiled[0] == compiled[1]


def test_cached_decoding_on_the_gpu_matches_uncached_and_the_cpu(trained: TrainResult) -> None:
    cpu_model = load_checkpoint(trained.run_dir, "cpu").model
    gpu_model = load_checkpoint(trained.run_dir, CUDA).model
    src = torch.tensor([[5, 9, 12, 7, 3], [8, 6, 0, 0, 0]])
    for config in (DecodingConfig(max_new_tokens=12), DecodingConfig(beam_size=4, n_best=2)):
        reference = decode(cpu_model, src, config)
        for use_cache in (True, False):
            got = decode(gpu_model, src.to(CUDA), DecodingConfig(
                **{**config.__dict__, "use_cache": use_cache}))  # fmt: skip
            for got_row, want_row in zip(got, reference, strict=True):
                for g, w in zip(got_row, want_row, strict=True):
                    assert g.ids == w.ids
                    assert g.token_logprobs == pytest.approx(w.token_logprobs, abs=1e-3)


def test_sampling_on_the_gpu_gives_the_cpus_samples() -> None:
    # The random numbers are a hash of (seed, source, sample, step), not a device generator.
    # Random weights: a spread-out distribution, so the samples differ from one another.
    cpu_model, gpu_model = random_model(), random_model().to(CUDA)
    src, _ = batch()
    config = DecodingConfig(temperature=1.0, num_samples=4, seed=3, max_new_tokens=10)
    cpu = [[h.ids for h in row] for row in decode(cpu_model, src, config)]
    gpu = [[h.ids for h in row] for row in decode(gpu_model, src.to(CUDA), config)]
    assert cpu == gpu
    assert len({tuple(ids) for ids in cpu[0]}) > 1  # really sampled


def test_cli_trains_generates_inspects_and_resumes_on_the_gpu(
    toy_data: Path, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    args = ["train", "--data", str(toy_data), "--out", str(out), "--max-steps", "40",
            "--device", "cuda", "--precision", "fp16", *TINY]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "device cuda" in result.output and "precision fp16" in result.output
    assert "exact match on validation" in result.stdout

    generated = runner.invoke(app, ["generate", str(out), "3 1 4", "--device", "cuda", "--json"])
    assert generated.exit_code == 0, generated.output
    assert json.loads(generated.stdout.splitlines()[0])["input"] == "3 1 4"
    on_cpu = runner.invoke(app, ["generate", str(out), "3 1 4", "--device", "cpu", "--json"])
    assert json.loads(on_cpu.stdout)["output"] == json.loads(generated.stdout)["output"]

    inspected = runner.invoke(app, ["inspect-attention", str(out), "3 1 4", "--device", "cuda",
                                    "--kind", "cross"])  # fmt: skip
    assert inspected.exit_code == 0, inspected.output
    assert "cross attention" in inspected.stdout

    resumed = tmp_path / "resumed"
    shutil.copytree(out, resumed)
    result = runner.invoke(app, ["train", "--resume", str(resumed), "--max-steps", "50"])
    assert result.exit_code == 0, result.output
    assert (resumed / "latest").read_text().strip() == "step-000050"


def test_dry_run_on_the_gpu_reports_allocated_memory(tmp_path: Path) -> None:
    out = tmp_path / "never"
    result = runner.invoke(
        app,
        ["train", "--dry-run", "--preset", "tiny", "--max-len", "32", "--max-tokens", "512",
         "--vocab-size", "200", "--device", "cuda", "--out", str(out)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "16 x 32 = 512 tokens" in result.stdout
    assert "allocated" in result.stdout and "target tokens/s" in result.stdout
    assert "largest --max-tokens (estimate)" in result.stdout
    assert not out.exists()


def test_more_processes_than_gpus_is_refused_in_one_line(tmp_path: Path) -> None:
    too_many = str(torch.cuda.device_count() + 1)
    result = runner.invoke(app, ["train", "--nproc", too_many, "--device", "cuda",
                                 "--out", str(tmp_path / "r")])  # fmt: skip
    assert result.exit_code == 5, result.output
    assert result.stderr.strip().splitlines() == [
        f"error: --nproc {too_many}: each process on CUDA needs its own GPU and "
        f"{torch.cuda.device_count()} CUDA device(s) are visible; use --nproc "
        f"{torch.cuda.device_count()} or fewer, or --device cpu"
    ]
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize(
    "config",
    [
        DecodingConfig(max_new_tokens=30),
        DecodingConfig(beam_size=4, n_best=2, max_new_tokens=30),
        DecodingConfig(temperature=1.0, num_samples=3, seed=5, max_new_tokens=30),
    ],
    ids=["greedy", "beam4", "samples3"],
)
def test_graphed_decoding_on_the_gpu_equals_eager(
    config: DecodingConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CUDA-graph steps against the eager cached step on the same GPU: beams reordered, rows
    dropped as sources finish, and the caches grown past their first capacity (4 here)."""
    from tformer.fast import graphs
    from tformer.fast.accelerate import accelerate

    net = accelerate(random_model()).to(CUDA).eval()
    src = batch()[0].to(CUDA)
    monkeypatch.setattr(graphs, "FIRST_CAPACITY", 4)
    monkeypatch.setenv(graphs.CUDA_GRAPHS, "0")
    eager = decode(net, src, config)
    monkeypatch.delenv(graphs.CUDA_GRAPHS)
    graphed = decode(net, src, config)
    same_hypotheses(graphed, eager)
    assert max(len(h.ids) for row in eager for h in row) > 8  # past two growths
    kept = net.__dict__["_step_graphs"].values()
    # Captured at a shape's first step (the rows' last bucket may have had none) and freed.
    assert any(g.graph is not None for g in kept) and not any(g.busy for g in kept)
    again = decode(net, src, config)  # the kept graphs replayed for the same shapes
    assert [[h.ids for h in row] for row in again] == [[h.ids for h in row] for row in graphed]


def test_graphed_decoding_after_training_steps_uses_the_new_weights(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Validation decodes, the optimizer writes the weights, validation decodes again (as a
    training run does): the graphs are captured anew, not replayed over freed packed weights."""
    from tformer.fast import graphs
    from tformer.fast.accelerate import accelerate

    net = accelerate(random_model()).to(CUDA)
    src, tgt = (t.to(CUDA) for t in batch())
    tgt_in, tgt_out = tgt[:, :-1], tgt[:, 1:]
    config = DecodingConfig(max_new_tokens=12)
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-2)
    for _ in range(3):
        net.eval()
        graphed = decode(net, src, config)
        monkeypatch.setenv(graphs.CUDA_GRAPHS, "0")
        same_hypotheses(graphed, decode(net, src, config))
        monkeypatch.delenv(graphs.CUDA_GRAPHS)
        net.train()
        for _ in range(2):
            logits = net(src, tgt_in).logits
            torch.nn.functional.cross_entropy(logits.flatten(0, 1), tgt_out.flatten()).backward()
            optimizer.step()
            optimizer.zero_grad()


def test_adam_on_the_gpu_updates_in_fused_kernels_as_foreach_does() -> None:
    from tformer.config import TrainConfig
    from tformer.training.optim import build_optimizer

    torch.manual_seed(0)
    config = ModelConfig(src_vocab_size=50, tgt_vocab_size=50, d_model=32, n_heads=2,
                         n_encoder_layers=1, n_decoder_layers=1, d_ff=64, dropout=0.0)  # fmt: skip
    fused_model = Transformer(config).cuda()
    foreach_model = Transformer(config).cuda()
    foreach_model.load_state_dict(fused_model.state_dict())
    fused = build_optimizer(fused_model, TrainConfig())
    assert fused.defaults["fused"] is True
    foreach = torch.optim.Adam(foreach_model.parameters(), betas=(0.9, 0.98), eps=1e-9,
                               foreach=True)  # fmt: skip
    for optimizer in (fused, foreach):
        for group in optimizer.param_groups:
            group["lr"] = 1e-3
    before = {name: p.detach().clone() for name, p in fused_model.named_parameters()}
    # The same gradients for both (some weights' backprop gradients are rounding noise, which
    # Adam's normalisation would blow up into different updates).
    for _ in range(5):
        for a, b in zip(fused_model.parameters(), foreach_model.parameters(), strict=True):
            a.grad = torch.randn_like(a)
            b.grad = a.grad.clone()
        fused.step()
        foreach.step()
    for (name, a), b in zip(fused_model.named_parameters(), foreach_model.parameters(),
                            strict=True):  # fmt: skip
        assert not torch.equal(a, before[name]), name
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)


def test_short_keys_train_through_the_formula_in_a_compiled_gpu_step() -> None:
    from tformer.fast.attention import GPU_SHORT_KEYS, fused_backward_is_slow

    q = torch.randn(2, 2, 3, 8, device=CUDA, requires_grad=True)
    low = q.to(torch.bfloat16)
    assert not fused_backward_is_slow(low, GPU_SHORT_KEYS)  # eager: torch's fused kernel

    def decided(keys: int) -> bool:
        decide = torch.compile(lambda x: (x * 1, fused_backward_is_slow(x, keys)), fullgraph=True)
        return bool(decide(low)[1])

    assert decided(GPU_SHORT_KEYS)
    assert not decided(GPU_SHORT_KEYS + 1)
    assert not fused_backward_is_slow(q, 8)  # fp32
    with torch.no_grad():
        assert not fused_backward_is_slow(low, 8)  # decoding
