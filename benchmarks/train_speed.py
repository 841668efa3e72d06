"""Training throughput and memory, tformer next to its peers, measured in ONE run.

Prints one JSON line per measurement, then a Markdown table. Measures:
- the hardware reference: dense matmul GFLOP/s (fp32 and bf16) at 2048^3;
- ms/step, target and total tokens/s and model FLOP utilisation (MFU, against the bf16 peak)
  for tformer, ``torch.nn.Transformer`` and (when ``transformers`` is importable) Hugging Face
  ``MarianMTModel``, all of the same shape, in fp32 and bf16 autocast (on a CPU that emulates
  bf16 products, without AVX-512-BF16 or AMX, the bf16 peak is tiny and MFU means nothing:
  read ms/step there);
- peak resident memory of a training step (each configuration in its own process);
- non-product ms: a step's time beyond its model products run at the measured peak of their
  precision (the reference is measured at the start and the end of the run, and the better of
  the two taken): what norms, dropout, residuals, softmax, the loss, the optimizer, casts and
  memory traffic cost, comparable across CPUs where ms/step is not;
- with ``--profile``, two steps of each configuration under torch.profiler, their time and the
  bytes their operations read split into op groups (large products, attention, loss,
  optimizer, casts, ...), in a table after the main one.

Every configuration runs with ``THP_MEM_ALLOC_ENABLE=1`` (large tensors on transparent huge
pages) and with freed memory kept for reuse (``tformer.fast.malloc``): the settings the command
line makes for itself (``tformer.configure_process``), unless the caller's environment says
otherwise (``THP_MEM_ALLOC_ENABLE=0``, ``TFORMER_KEEP_FREED_MEMORY=0``).

Shapes (the performance issue): S = d_model 256, 4 heads, 3+3 layers, d_ff 1024, vocab 8000;
B = the paper's base, 512, 8 heads, 6+6, 2048, vocab 32000; batches of 64 pairs of length 32.

FLOP formula (matmuls only, multiply-add = 2 FLOPs, training = 3x forward):
    per source token:  L_enc * (8 d^2 + 4 d d_ff + 4 S d)
    per target token:  L_dec * (8 d^2 + 4 T d  +  4 d^2 + 4 S d  +  4 d d_ff) + 2 d V
    plus cross-attention K/V projections, 4 d^2 per source token per decoder layer.

On a GPU (``--device cuda``) the precisions are fp32 (TF32 off, torch's default), tf32 (fp32
with TF32 matmuls allowed), bf16 autocast and fp16 autocast with a grad scaler; the reference
peak is a dense 8192^3 matmul; peak memory is the CUDA allocator's peak
(``torch.cuda.max_memory_allocated``); every step is timed between two device
synchronisations. ``--compile`` adds each implementation (``--impls``) under
``torch.compile`` in bf16.

Usage: python benchmarks/train_speed.py [--shapes S,B] [--repeats 5] [--batch 64]
       [--device cpu|cuda] [--compile] [--precisions fp32,bf16] [--impls tformer] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from side_by_side import commands_pool, with_threads  # benchmarks/, beside this script

if TYPE_CHECKING:
    from tformer.training.precision import Precision

SHAPES: dict[str, dict[str, int]] = {
    "S": dict(d_model=256, n_heads=4, layers=3, d_ff=1024, vocab=8000),
    "B": dict(d_model=512, n_heads=8, layers=6, d_ff=2048, vocab=32000),
    "smoke": dict(d_model=32, n_heads=2, layers=1, d_ff=64, vocab=200),
}


@dataclass
class Workload:
    shape: str
    batch: int = 64
    length: int = 32

    @property
    def dims(self) -> dict[str, int]:
        return SHAPES[self.shape]

    def data(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(0)
        v = self.dims["vocab"]
        make = lambda: torch.randint(4, v, (self.batch, self.length), generator=g)  # noqa: E731
        return make(), make(), make()

    def train_flops(self) -> float:
        d, ff, n, v = (self.dims[k] for k in ("d_model", "d_ff", "layers", "vocab"))
        s = t = self.length
        src_tokens = tgt_tokens = self.batch * self.length
        enc = n * (8 * d * d + 4 * d * ff + 4 * s * d) * src_tokens
        dec = (n * (8 * d * d + 4 * t * d + 4 * d * d + 4 * s * d + 4 * d * ff) + 2 * d * v)
        cross_kv = n * 4 * d * d * src_tokens
        return 3.0 * (enc + dec * tgt_tokens + cross_kv)


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (GPU kernels run asynchronously to the host)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_peak(dtype: torch.dtype, n: int = 2048, repeats: int = 5,
                device: str | torch.device = "cpu") -> tuple[float, int]:
    """Dense n^3 matmul GFLOP/s (best of ``repeats``) and the n it was measured at.

    On a CPU without native bf16 products (no AVX-512-BF16, no AMX) torch emulates them, and
    one 2048^3 product took over a minute: a 256^3 product is timed first, and n halved until
    one product should take at most REFERENCE_SECONDS, so the reference never holds a run for
    minutes.
    """
    device = torch.device(device)
    if device.type == "cpu":
        probe = min(n, 256)
        a, b = torch.randn(probe, probe, dtype=dtype), torch.randn(probe, probe, dtype=dtype)
        a @ b
        start = time.perf_counter()
        a @ b
        seconds = time.perf_counter() - start
        while n > probe and seconds * (n / probe) ** 3 > REFERENCE_SECONDS:
            n //= 2
    a = torch.randn(n, n, dtype=dtype, device=device)
    b = torch.randn(n, n, dtype=dtype, device=device)
    a @ b
    synchronize(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        synchronize(device)
        times.append(time.perf_counter() - start)
    return 2 * n**3 / min(times) / 1e9, n


# The longest one reference product may take on a CPU before the reference is measured smaller.
REFERENCE_SECONDS = 2.0


# How Adam updates the weights, the same for every implementation: "auto" is what tformer's
# training uses on the device (fused kernels on a CPU and a GPU, foreach elsewhere).
ADAM = "auto"
# tformer's attention kernel: "auto" is its own choice (tformer/fast/attention.py), "fused"
# always torch's fused kernel.
ATTENTION = "auto"
# Every implementation's dropout (the paper's 0.1; 0 measures what dropout costs).
DROPOUT = 0.1
# Whether each configuration's process also profiles two steps (--profile).
PROFILE = False


def adam(params: list[torch.nn.Parameter]) -> torch.optim.Adam:
    from tformer.training.optim import update_kernels

    kernels = update_kernels(params) if ADAM == "auto" else {ADAM: True}
    return torch.optim.Adam(params, lr=1e-4, betas=(0.9, 0.98), eps=1e-9, **kernels)


def optimize(loss: torch.Tensor, params: list[torch.nn.Parameter],
             optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler | None) -> None:
    """backward, clip, step, zero: the same update for every implementation (fp16 scaled)."""
    if scaler is None:
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
    else:
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        scaler.step(optimizer)
        scaler.update()
    optimizer.zero_grad(set_to_none=True)


@dataclass
class Run:
    """How one configuration runs: where, in which precision, compiled or not."""

    device: torch.device
    precision: str
    compiled: bool = False
    compile_mode: str | None = None  # torch.compile's mode; None: its default

    @property
    def mode(self) -> Precision:
        """tformer's own precision settings (autocast dtype, grad scaler), for every
        implementation alike."""
        from tformer.training.precision import Precision

        name = "fp32" if self.precision == "tf32" else self.precision  # TF32: fp32 weights
        return Precision(name=name, device_type=self.device.type)  # type: ignore[arg-type]

    def wrap(self, forward: Callable[..., Any]) -> Callable[..., Any]:
        return torch.compile(forward, mode=self.compile_mode) if self.compiled else forward


# -- the three implementations, each as "build a step function" -------------------------------


def tformer_step(work: Workload, run: Run) -> Callable[[], None]:
    from tformer.config import ModelConfig
    from tformer.fast.accelerate import accelerate
    from tformer.model import Transformer
    from tformer.training.loss import scaled_loss

    if ATTENTION == "fused":  # torch's fused kernel everywhere, where tformer may write it out
        from tformer.fast.attention import FastMultiHeadAttention

        FastMultiHeadAttention.fused_kernel = lambda self, q, k: True  # type: ignore[method-assign]
    d = work.dims
    config = ModelConfig(src_vocab_size=d["vocab"], tgt_vocab_size=d["vocab"],
                         d_model=d["d_model"], n_heads=d["n_heads"],
                         n_encoder_layers=d["layers"], n_decoder_layers=d["layers"],
                         d_ff=d["d_ff"], dropout=DROPOUT)
    model = accelerate(Transformer(config)).to(run.device).train()
    params = list(model.parameters())
    optimizer = adam(params)
    src, tgt_in, tgt_out = (t.to(run.device) for t in work.data())
    forward, scaler = run.wrap(model), run.mode.scaler()

    def step() -> None:
        with run.mode.autocast():
            logits = forward(src, tgt_in).logits
        _, loss = scaled_loss(logits, tgt_out, 0.1, 1 / tgt_out.numel(), fused=run.compiled)
        optimize(loss, params, optimizer, scaler)

    return step


def torch_transformer_step(work: Workload, run: Run) -> Callable[[], None]:
    d = work.dims
    embed = torch.nn.Embedding(d["vocab"], d["d_model"]).to(run.device)
    core = torch.nn.Transformer(d["d_model"], d["n_heads"], d["layers"], d["layers"], d["d_ff"],
                                DROPOUT, batch_first=True).to(run.device)
    head = torch.nn.Linear(d["d_model"], d["vocab"], bias=False).to(run.device)
    head.weight = embed.weight
    params = list(embed.parameters()) + list(core.parameters())
    optimizer = adam(params)
    src, tgt_in, tgt_out = (t.to(run.device) for t in work.data())
    mask = torch.nn.Transformer.generate_square_subsequent_mask(work.length, device=run.device)
    scale = d["d_model"] ** 0.5
    scaler = run.mode.scaler()

    def logits_of(src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        hidden = core(embed(src) * scale, embed(tgt_in) * scale, tgt_mask=mask,
                      tgt_is_causal=True)
        return head(hidden)

    forward = run.wrap(logits_of)

    def step() -> None:
        with run.mode.autocast():
            logits = forward(src, tgt_in)
        loss = F.cross_entropy(logits.reshape(-1, d["vocab"]).float(), tgt_out.reshape(-1),
                               label_smoothing=0.1)
        optimize(loss, params, optimizer, scaler)

    return step


def marian_step(work: Workload, run: Run) -> Callable[[], None]:
    from transformers import MarianConfig, MarianMTModel  # type: ignore[import-not-found]

    d = work.dims
    config = MarianConfig(vocab_size=d["vocab"], d_model=d["d_model"],
                          encoder_layers=d["layers"], decoder_layers=d["layers"],
                          encoder_attention_heads=d["n_heads"],
                          decoder_attention_heads=d["n_heads"], encoder_ffn_dim=d["d_ff"],
                          decoder_ffn_dim=d["d_ff"], dropout=DROPOUT, pad_token_id=0,
                          decoder_start_token_id=1, max_position_embeddings=512)
    model = MarianMTModel(config).to(run.device).train()
    params = list(model.parameters())
    optimizer = adam(params)
    src, tgt_in, tgt_out = (t.to(run.device) for t in work.data())
    forward, scaler = run.wrap(model), run.mode.scaler()

    def step() -> None:
        with run.mode.autocast():
            logits = forward(input_ids=src, decoder_input_ids=tgt_in).logits
        loss = F.cross_entropy(logits.reshape(-1, d["vocab"]).float(), tgt_out.reshape(-1),
                               label_smoothing=0.1)
        optimize(loss, params, optimizer, scaler)

    return step


IMPLEMENTATIONS: dict[str, Callable[[Workload, Run], Callable[[], None]]] = {
    "tformer": tformer_step,
    "torch.nn.Transformer": torch_transformer_step,
    "hf-marian": marian_step,
}


def measure(impl: str, work: Workload, run: Run, repeats: int,
            step: Callable[[], None]) -> dict[str, Any]:
    """``repeats`` timed calls of ``step`` (built by ``IMPLEMENTATIONS[impl]``) after a warm-up."""
    # Warm-up: allocator, autocast weight casts, lazy init; compiling (several calls: a
    # compiled step can recompile once after its first call).
    for _ in range(3 if run.compiled else 1):
        step()
    synchronize(run.device)
    times, host = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        host.append(time.perf_counter() - start)  # the host's share: queueing the work
        synchronize(run.device)
        times.append(time.perf_counter() - start)
    seconds = statistics.median(times)
    tokens = work.batch * work.length
    memory = (
        {"peak_gpu_mb": round(torch.cuda.max_memory_allocated(run.device) / 2**20, 1)}
        if run.device.type == "cuda"
        else {"peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}
    )
    return {
        "impl": impl, "shape": work.shape, "precision": run.precision,
        "compiled": run.compiled, "device": run.device.type, "batch": work.batch, "adam": ADAM,
        "attention": ATTENTION, "dropout": DROPOUT, "compile_mode": run.compile_mode,
        "inductor_env": {k: v for k, v in os.environ.items()  # the compiler's options set
                         if k.startswith("TORCHINDUCTOR_") and "CACHE" not in k},
        "ms_per_step": round(seconds * 1000, 2),
        # Near ms_per_step, the device waits on the host (launches); far under, the reverse.
        "host_ms_per_step": round(statistics.median(host) * 1000, 2),
        "target_tokens_per_s": round(tokens / seconds, 1),
        "total_tokens_per_s": round(2 * tokens / seconds, 1),
        "model_gflops_per_s": round(work.train_flops() / seconds / 1e9, 2),
        "model_gflop_per_step": round(work.train_flops() / 1e9, 3),
        **memory,
    }


# Op groups of a profiled step, first match wins: an operation belongs to the first group whose
# ancestor pattern matches one of its callers (or itself), else to the first whose own-name
# pattern matches it. "products" are the model's large matrix products; everything else is what
# the issue of a matrix-engine CPU calls the non-product time.
ANCESTOR_GROUPS: list[tuple[str, str]] = [
    ("optimizer", r"Optimizer\.|clip_grad|_foreach_"),
    ("loss", r"SmoothedCrossEntropy|cross_entropy|log_softmax|nll_loss"),
    ("attention", r"scaled_dot_product|Bmm|Softmax|_softmax"),
    ("norm", r"layer_norm|LayerNorm|rms_norm"),
    ("dropout", r"dropout|Dropout|bernoulli|randint|random_"),
    ("casts", r"ToCopyBackward|aten::_to_copy"),
    ("embedding", r"embedding|Embedding"),
]
OWN_GROUPS: list[tuple[str, str]] = [
    ("products", r"^aten::(mm|addmm|matmul|linear)$"),
    ("attention", r"^aten::(bmm|baddbmm)$"),
    ("layout copies", r"^aten::(copy_|clone|contiguous)$"),
]


def op_group(event: Any) -> str:
    """The group of one profiled operation (see ANCESTOR_GROUPS)."""
    chain, parent = [event.name], event.cpu_parent
    while parent is not None:
        chain.append(parent.name)
        parent = parent.cpu_parent
    for group, pattern in ANCESTOR_GROUPS:
        if any(re.search(pattern, name) for name in chain):
            return group
    for group, pattern in OWN_GROUPS:
        if re.search(pattern, event.name):
            return group
    return "elementwise and other"


_DTYPE_BYTES = {"float": 4, "c10::BFloat16": 2, "c10::Half": 2, "double": 8, "long int": 8,
                "int": 4, "bool": 1, "short int": 2, "signed char": 1, "unsigned char": 1}


def input_bytes(event: Any) -> int:
    """Bytes of the tensors an operation reads (its inputs; outputs are not recorded)."""
    total = 0
    for shape, dtype in zip(event.input_shapes or [], event.input_dtypes or [], strict=False):
        if isinstance(shape, list) and shape and all(isinstance(n, int) for n in shape):
            total += math.prod(shape) * _DTYPE_BYTES.get(dtype, 4)
    return total


# Operations that move no data (views, allocations, metadata): an operation calling only these
# is where bytes are read.
_NO_DATA = re.compile(r"^aten::(view|_?reshape\w*|empty\w*|as_strided|t|transpose|permute|"
                      r"expand\w*|unsqueeze|squeeze|select|slice|detach|alias|unfold|"
                      r"resolve_(conj|neg)|lift_fresh|_unsafe_view|split|chunk|narrow)$")


def reads_data(event: Any) -> bool:
    """Whether ``event`` is where tensors are read: it moves data and its callees do not."""
    return not _NO_DATA.match(event.name) and all(
        _NO_DATA.match(child.name) for child in event.cpu_children)


def op_groups(events: list[Any], steps: int) -> list[dict[str, Any]]:
    """Per group: self time per step (ms), bytes read per step by its operations that read
    tensors themselves (:func:`reads_data`), calls per step and its three costliest
    operations."""
    groups: dict[str, dict[str, Any]] = {}
    for event in events:
        g = groups.setdefault(op_group(event), {"us": 0.0, "bytes": 0, "calls": 0, "ops": {}})
        g["us"] += event.self_cpu_time_total
        g["calls"] += 1
        g["ops"][event.name] = g["ops"].get(event.name, 0.0) + event.self_cpu_time_total
        if reads_data(event):
            g["bytes"] += input_bytes(event)
    rows = []
    for name, g in sorted(groups.items(), key=lambda item: -item[1]["us"]):
        top = sorted(g["ops"].items(), key=lambda item: -item[1])[:3]
        rows.append({"group": name, "ms_per_step": round(g["us"] / 1000 / steps, 1),
                     "mb_read_per_step": round(g["bytes"] / 2**20 / steps, 1),
                     "calls_per_step": g["calls"] // steps,
                     "top_ops": {op: round(us / 1000 / steps, 1) for op, us in top}})
    return rows


def profile(step: Callable[[], None], run: Run, steps: int = 2) -> list[dict[str, Any]]:
    """Two calls of a measured ``step`` under torch.profiler (after :func:`measure`'s, so
    compiling and the allocator's first steps stay out of them, and peak memory is the step's
    own): the costliest operations printed, and their time and bytes split into op groups
    (:func:`op_groups`), returned."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as profiler

    activities = [ProfilerActivity.CPU] + (
        [ProfilerActivity.CUDA] if run.device.type == "cuda" else []
    )
    with profiler(activities=activities, record_shapes=True) as prof:
        for _ in range(steps):
            step()
        synchronize(run.device)
    key = "cuda_time_total" if run.device.type == "cuda" else "cpu_time_total"
    print(prof.key_averages().table(sort_by=key, row_limit=30), file=sys.stderr, flush=True)
    return op_groups(list(prof.events()), steps)


def run_isolated(impl: str, shape: str, precision: str, repeats: int, *, batch: int = 64,
                 device: str = "cpu", compiled: bool = False, compile_mode: str | None = None,
                 threads: int | None = None) -> dict[str, Any] | None:
    """One measurement in a fresh process, so peak memory belongs to that configuration;
    ``threads``: its torch threads (default: torch's choice)."""
    cmd = [sys.executable, __file__, "--one", impl, shape, precision, str(repeats),
           "--batch", str(batch), "--device", device, "--adam", ADAM, "--attention", ATTENTION,
           "--dropout", str(DROPOUT)] + (["--compile"] if compiled else []) + (
               ["--profile"] if PROFILE else []) + (
               ["--compile-mode", compile_mode] if compile_mode else [])
    # Every implementation gets the allocator setting tformer makes for itself (huge pages for
    # large tensors, see tformer/fast/process.py), so the comparison is of the code, not of it.
    env = with_threads(threads, {**os.environ, "THP_MEM_ALLOC_ENABLE":
                                 os.environ.get("THP_MEM_ALLOC_ENABLE", "1")})  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if PROFILE:  # the profiler's table of costliest operations
        sys.stderr.write(proc.stderr)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["failed"])[-1]
        return {"impl": impl, "shape": shape, "precision": precision, "compiled": compiled,
                "skipped": tail}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="S,B")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batch", type=int, default=64, help="sentence pairs per step")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--compile", action="store_true",
                        help="also measure every implementation under torch.compile (bf16)")
    parser.add_argument("--precisions", default=None,
                        help="comma-separated, of fp32,bf16(,fp16 on CUDA); default: all")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny shape, one repeat, without HF Marian, the processes "
                        "side by side (CI)")
    parser.add_argument("--impls", default=None,
                        help="comma-separated, of " + ",".join(IMPLEMENTATIONS) + "; default: all")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="also profile two steps of each configuration after its measured ones: its 30 "
        "costliest operations "
        "(stderr) and the step split into op groups, large products and the rest, with "
        "their ms and bytes read (a table after the main one)",
    )
    parser.add_argument(
        "--adam",
        default="auto",
        choices=["auto", "foreach", "fused"],
        help="Adam's update kernels for every implementation (auto: tformer's own choice, "
        "fused on a CPU and a GPU)",
    )
    parser.add_argument(
        "--attention",
        default="auto",
        choices=["auto", "fused"],
        help="tformer's attention kernel (auto: its own choice; fused: always torch's)",
    )
    parser.add_argument(
        "--compile-mode",
        default=None,
        choices=["reduce-overhead", "max-autotune-no-cudagraphs", "max-autotune"],
        help="with --compile: torch.compile's mode for every implementation (default: its "
        "default; TORCHINDUCTOR_* variables set the compiler's options)",
    )
    parser.add_argument("--dropout", type=float, default=0.1,
                        help="every implementation's dropout (default: the paper's 0.1)")
    parser.add_argument("--one", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    global ADAM, ATTENTION, DROPOUT, PROFILE
    ADAM, ATTENTION, DROPOUT, PROFILE = args.adam, args.attention, args.dropout, args.profile
    device = torch.device(args.device)
    if args.one:
        impl, shape, precision, repeats = args.one
        work = Workload(shape, batch=4 if shape == "smoke" else args.batch,
                        length=8 if shape == "smoke" else 32)
        run = Run(device, precision, compiled=args.compile, compile_mode=args.compile_mode)
        if precision == "tf32":  # fp32 matmuls on the tensor cores, 10-bit mantissa inputs
            torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        # Every implementation also keeps freed memory for reuse, as tformer's training does
        # for itself (tformer/fast/malloc.py; TFORMER_KEEP_FREED_MEMORY=0 turns it off for all).
        from tformer.fast.malloc import keep_freed_memory

        kept = keep_freed_memory()
        step = IMPLEMENTATIONS[impl](work, run)
        row = {**measure(impl, work, run, int(repeats), step), "keep_freed_memory": kept}
        if args.profile:
            row["op_groups"] = profile(step, run)
        print(json.dumps(row))
        return

    shapes = ["smoke"] if args.smoke else args.shapes.split(",")
    repeats = 1 if args.smoke else args.repeats
    size = 256 if args.smoke else 8192 if device.type == "cuda" else 2048
    measured = {"fp32": matmul_peak(torch.float32, size, device=device),
                "bf16": matmul_peak(torch.bfloat16, size, device=device)}
    peaks = {name: gflops for name, (gflops, _) in measured.items()}
    from tformer.analysis.evaluate import cpu_description

    record = {"reference": f"dense matmul {size}^3", "fp32_gflops": round(peaks["fp32"], 1),
              "bf16_gflops": round(peaks["bf16"], 1), "threads": torch.get_num_threads(),
              "torch": torch.__version__, **cpu_description()}
    for name, (_, n) in measured.items():
        if n != size:  # measured smaller: see matmul_peak
            record[f"{name}_reference_size"] = n
    if device.type == "cuda":
        record["gpu"] = torch.cuda.get_device_name(device)
    print(json.dumps(record), flush=True)
    impls = ["tformer", "torch.nn.Transformer"]
    if args.smoke:  # importing transformers takes longer than the smoke's steps
        print(json.dumps({"note": "smoke: HF Marian skipped"}))
    else:
        try:
            import transformers  # type: ignore[import-not-found]  # noqa: F401

            impls = list(IMPLEMENTATIONS)
        except ImportError:
            print(json.dumps({"note": "transformers is not installed: HF Marian skipped"}))
    if args.impls:
        impls = [i for i in args.impls.split(",") if i in impls]
    precisions = ["fp32", "bf16"] + (["tf32", "fp16"] if device.type == "cuda" else [])
    if args.precisions:
        precisions = [p for p in args.precisions.split(",") if p in precisions]
    variants = [(p, False) for p in precisions] + ([("bf16", True)] if args.compile else [])
    configurations = [(impl, shape, precision, compiled) for shape in shapes
                      for precision, compiled in variants for impl in impls]  # fmt: skip

    def isolated(configuration: tuple[str, str, str, bool]) -> dict[str, Any] | None:
        impl, shape, precision, compiled = configuration
        return run_isolated(impl, shape, precision, repeats, batch=args.batch,
                            device=args.device, compiled=compiled,
                            compile_mode=args.compile_mode if compiled else None,
                            threads=1 if args.smoke else None)  # fmt: skip

    # Smoke: the processes run side by side (start-up is most of each); otherwise one at a
    # time, so none slows another.
    with commands_pool(args.smoke) as lanes:
        rows = [row for row in lanes.map(isolated, configurations) if row]
    # The reference again at the end: on a shared machine whose speed drifts over minutes,
    # the better of the two is the closer to the hardware's peak.
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        peaks[name] = max(peaks[name], matmul_peak(dtype, measured[name][1], device=device)[0])
    print(json.dumps({"reference_end": record["reference"],
                      **{f"{k}_gflops": round(v, 1) for k, v in peaks.items()}}), flush=True)
    for row in rows:
        if "model_gflops_per_s" in row:
            row["mfu_vs_bf16_peak"] = round(row["model_gflops_per_s"] / peaks["bf16"], 4)
            row["non_product_ms"] = non_product_ms(row, peaks)
        print(json.dumps(row), flush=True)
    print()
    print_table(rows, device)
    print_profiles(rows)

def non_product_ms(row: dict[str, Any], peaks: dict[str, float]) -> float:
    """A step's time beyond its model products run at the measured peak of their precision
    (fp32's for fp32 rows, bf16's for the others): what is not a large product (norms,
    dropout, residuals, softmax, the loss, the optimizer, casts, memory traffic) plus the
    products' own shortfall from the peak. Comparable across CPUs where ms/step is not."""
    peak = peaks["fp32" if row["precision"] == "fp32" else "bf16"]
    return round(row["ms_per_step"] - row["model_gflop_per_step"] / peak * 1000, 1)


def label(r: dict[str, Any]) -> str:
    """A row's precision column: the precision and whatever differs from the defaults."""
    precision = r["precision"] + (" compiled" if r.get("compiled") else "")
    if r.get("adam", "auto") != "auto":
        precision += f" (Adam {r['adam']})"
    if r.get("attention", "auto") != "auto":
        precision += f" ({r['attention']} attention)"
    if r.get("compile_mode"):
        precision += f" ({r['compile_mode']})"
    if r.get("inductor_env"):
        precision += " (" + " ".join(f"{k}={v}" for k, v in r["inductor_env"].items()) + ")"
    if r.get("dropout", 0.1) != 0.1:
        precision += f" (dropout {r['dropout']})"
    return precision


def print_table(rows: list[dict[str, Any]], device: torch.device) -> None:
    memory = "peak GPU MB (allocated)" if device.type == "cuda" else "peak RSS MB"
    print(f"| shape | precision | implementation | ms/step | non-product ms | target tok/s "
          f"| MFU (bf16 peak) | {memory} |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for r in rows:
        if "skipped" in r:
            print(f"| {r['shape']} | {label(r)} | {r['impl']} | skipped: {r['skipped']} "
                  "| | | | |")
            continue
        peak = r.get("peak_gpu_mb", r.get("peak_rss_mb", 0.0))
        print(f"| {r['shape']} | {label(r)} | {r['impl']} | {r['ms_per_step']} | "
              f"{r['non_product_ms']} | {r['target_tokens_per_s']:,.0f} | "
              f"{r['mfu_vs_bf16_peak']:.1%} | {peak:,.0f} |")


def print_profiles(rows: list[dict[str, Any]]) -> None:
    """With --profile: each configuration's step split into op groups."""
    for r in rows:
        if not r.get("op_groups"):
            continue
        total = sum(g["ms_per_step"] for g in r["op_groups"])
        print(f"\n{r['impl']}, {r['shape']}, {label(r)}: {total:,.0f} ms of operations "
              f"per profiled step ({r['ms_per_step']} ms/step unprofiled)\n")
        print("| op group | ms/step | share | MB read/step | calls/step | costliest operations |")
        print("|---|---:|---:|---:|---:|---|")
        for g in r["op_groups"]:
            ops = ", ".join(f"{op} {ms}" for op, ms in g["top_ops"].items())
            print(f"| {g['group']} | {g['ms_per_step']:,} | {g['ms_per_step'] / total:.1%} | "
                  f"{g['mb_read_per_step']:,} | {g['calls_per_step']} | {ops} |")


if __name__ == "__main__":
    main()
