"""Training throughput and memory, tformer next to its peers, measured in ONE run.

Prints one JSON line per measurement, then a Markdown table. Measures:
- the hardware reference: dense matmul GFLOP/s (fp32 and bf16) at 2048^3;
- ms/step, target and total tokens/s and model FLOP utilisation (MFU, against the bf16 peak)
  for tformer, ``torch.nn.Transformer`` and (when ``transformers`` is importable) Hugging Face
  ``MarianMTModel``, all of the same shape, in fp32 and bf16 autocast;
- peak resident memory of a training step (each configuration in its own process).

Every configuration runs with ``THP_MEM_ALLOC_ENABLE=1`` (large tensors on transparent huge
pages) and with freed memory kept for reuse (``tformer.malloc``): the settings tformer makes for
itself, unless the caller's environment says otherwise (``THP_MEM_ALLOC_ENABLE=0``,
``TFORMER_KEEP_FREED_MEMORY=0``).

Shapes (the performance issue): S = d_model 256, 4 heads, 3+3 layers, d_ff 1024, vocab 8000;
B = the paper's base, 512, 8 heads, 6+6, 2048, vocab 32000; batches of 64 pairs of length 32.

FLOP formula (matmuls only, multiply-add = 2 FLOPs, training = 3x forward):
    per source token:  L_enc * (8 d^2 + 4 d d_ff + 4 S d)
    per target token:  L_dec * (8 d^2 + 4 T d  +  4 d^2 + 4 S d  +  4 d d_ff) + 2 d V
    plus cross-attention K/V projections, 4 d^2 per source token per decoder layer.

Usage: python benchmarks/train_speed.py [--shapes S,B] [--repeats 5] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

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


def matmul_peak(dtype: torch.dtype, n: int = 2048, repeats: int = 5) -> float:
    a = torch.randn(n, n, dtype=dtype)
    b = torch.randn(n, n, dtype=dtype)
    a @ b
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - start)
    return 2 * n**3 / min(times) / 1e9


# -- the three implementations, each as "build a step function" -------------------------------


def tformer_step(work: Workload, precision: str) -> Callable[[], None]:
    from tformer.config import ModelConfig
    from tformer.loss import sequence_loss
    from tformer.model import Transformer

    d = work.dims
    config = ModelConfig(src_vocab_size=d["vocab"], tgt_vocab_size=d["vocab"],
                         d_model=d["d_model"], n_heads=d["n_heads"],
                         n_encoder_layers=d["layers"], n_decoder_layers=d["layers"],
                         d_ff=d["d_ff"], dropout=0.1)
    model = Transformer(config).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9,
                                 foreach=True)
    src, tgt_in, tgt_out = work.data()

    def step() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            logits = model(src, tgt_in).logits
        loss = sequence_loss(logits, tgt_out, 0.1) / tgt_out.numel()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def torch_transformer_step(work: Workload, precision: str) -> Callable[[], None]:
    d = work.dims
    embed = torch.nn.Embedding(d["vocab"], d["d_model"])
    core = torch.nn.Transformer(d["d_model"], d["n_heads"], d["layers"], d["layers"], d["d_ff"],
                                0.1, batch_first=True)
    head = torch.nn.Linear(d["d_model"], d["vocab"], bias=False)
    head.weight = embed.weight
    params = list(embed.parameters()) + list(core.parameters())
    optimizer = torch.optim.Adam(params, lr=1e-4, betas=(0.9, 0.98), eps=1e-9, foreach=True)
    src, tgt_in, tgt_out = work.data()
    mask = torch.nn.Transformer.generate_square_subsequent_mask(work.length)
    scale = d["d_model"] ** 0.5

    def step() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            hidden = core(embed(src) * scale, embed(tgt_in) * scale, tgt_mask=mask,
                          tgt_is_causal=True)
            logits = head(hidden)
        loss = F.cross_entropy(logits.reshape(-1, d["vocab"]).float(), tgt_out.reshape(-1),
                               label_smoothing=0.1)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def marian_step(work: Workload, precision: str) -> Callable[[], None]:
    from transformers import MarianConfig, MarianMTModel  # type: ignore[import-not-found]

    d = work.dims
    config = MarianConfig(vocab_size=d["vocab"], d_model=d["d_model"],
                          encoder_layers=d["layers"], decoder_layers=d["layers"],
                          encoder_attention_heads=d["n_heads"],
                          decoder_attention_heads=d["n_heads"], encoder_ffn_dim=d["d_ff"],
                          decoder_ffn_dim=d["d_ff"], dropout=0.1, pad_token_id=0,
                          decoder_start_token_id=1, max_position_embeddings=512)
    model = MarianMTModel(config).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9,
                                 foreach=True)
    src, tgt_in, tgt_out = work.data()

    def step() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            logits = model(input_ids=src, decoder_input_ids=tgt_in).logits
        loss = F.cross_entropy(logits.reshape(-1, d["vocab"]).float(), tgt_out.reshape(-1),
                               label_smoothing=0.1)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


IMPLEMENTATIONS: dict[str, Callable[[Workload, str], Callable[[], None]]] = {
    "tformer": tformer_step,
    "torch.nn.Transformer": torch_transformer_step,
    "hf-marian": marian_step,
}


def measure(impl: str, work: Workload, precision: str, repeats: int) -> dict[str, Any]:
    step = IMPLEMENTATIONS[impl](work, precision)
    step()  # warm-up: allocator, autocast weight casts, lazy init
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    seconds = statistics.median(times)
    tokens = work.batch * work.length
    return {
        "impl": impl, "shape": work.shape, "precision": precision,
        "ms_per_step": round(seconds * 1000, 1),
        "target_tokens_per_s": round(tokens / seconds, 1),
        "total_tokens_per_s": round(2 * tokens / seconds, 1),
        "model_gflops_per_s": round(work.train_flops() / seconds / 1e9, 2),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def run_isolated(impl: str, shape: str, precision: str, repeats: int) -> dict[str, Any] | None:
    """One measurement in a fresh process, so peak memory belongs to that configuration."""
    cmd = [sys.executable, __file__, "--one", impl, shape, precision, str(repeats)]
    # Every implementation gets the allocator setting tformer makes for itself (huge pages for
    # large tensors, see tformer/_hugepages.py), so the comparison is of the code, not of it.
    env = {**os.environ, "THP_MEM_ALLOC_ENABLE": os.environ.get("THP_MEM_ALLOC_ENABLE", "1")}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["failed"])[-1]
        return {"impl": impl, "shape": shape, "precision": precision, "skipped": tail}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="S,B")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--smoke", action="store_true", help="tiny shape, one repeat (CI)")
    parser.add_argument("--one", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        impl, shape, precision, repeats = args.one
        work = Workload(shape, batch=4 if shape == "smoke" else 64,
                        length=8 if shape == "smoke" else 32)
        # Every implementation also keeps freed memory for reuse, as tformer's training does
        # for itself (tformer/malloc.py; TFORMER_KEEP_FREED_MEMORY=0 turns it off for all).
        from tformer.malloc import keep_freed_memory

        kept = keep_freed_memory()
        print(json.dumps({**measure(impl, work, precision, int(repeats)),
                          "keep_freed_memory": kept}))
        return

    shapes = ["smoke"] if args.smoke else args.shapes.split(",")
    repeats = 1 if args.smoke else args.repeats
    rows: list[dict[str, Any]] = []
    peaks = {"fp32": matmul_peak(torch.float32, 256 if args.smoke else 2048),
             "bf16": matmul_peak(torch.bfloat16, 256 if args.smoke else 2048)}
    from tformer.evaluate import cpu_description

    record = {"reference": "dense matmul", "fp32_gflops": round(peaks["fp32"], 1),
              "bf16_gflops": round(peaks["bf16"], 1), "threads": torch.get_num_threads(),
              "torch": torch.__version__, **cpu_description()}
    print(json.dumps(record), flush=True)
    try:
        import transformers  # type: ignore[import-not-found]  # noqa: F401

        impls = list(IMPLEMENTATIONS)
    except ImportError:
        impls = ["tformer", "torch.nn.Transformer"]
        print(json.dumps({"note": "transformers is not installed: HF Marian skipped"}))
    for shape in shapes:
        for precision in ("fp32", "bf16"):
            for impl in impls:
                row = run_isolated(impl, shape, precision, repeats)
                if row and "model_gflops_per_s" in row:
                    row["mfu_vs_bf16_peak"] = round(row["model_gflops_per_s"] / peaks["bf16"], 4)
                print(json.dumps(row), flush=True)
                if row:
                    rows.append(row)
    print()
    print("| shape | precision | implementation | ms/step | target tok/s | MFU (bf16 peak) "
          "| peak RSS MB |")
    print("|---|---|---|---:|---:|---:|---:|")
    for r in rows:
        if "skipped" in r:
            print(f"| {r['shape']} | {r['precision']} | {r['impl']} | skipped: {r['skipped']} "
                  "| | | |")
            continue
        print(f"| {r['shape']} | {r['precision']} | {r['impl']} | {r['ms_per_step']} | "
              f"{r['target_tokens_per_s']:,.0f} | {r['mfu_vs_bf16_peak']:.1%} | "
              f"{r['peak_rss_mb']:,.0f} |")


if __name__ == "__main__":
    main()
