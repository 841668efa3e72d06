"""The training loss alone: forward and backward of label-smoothed cross-entropy over a step's
logits, tformer's blocked loss against ``F.cross_entropy``, in one run.

    python benchmarks/loss_speed.py [--shapes S,B] [--precisions fp32,bf16] [--repeats 15] [--smoke]

A training step's logits are its largest tensor (tokens x vocabulary), so each pass over them
is visible in the step; this times that part on its own, where a whole step's spread between
runs would hide it. The backward receives 1 / tokens, as a training step's does. Prints one
JSON line per configuration (median, min and max ms over the repeats), then a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from tformer.config import PAD_ID
from tformer.training.loss import scaled_loss

# Tokens per step and vocabulary of train_speed.py's shapes (64 pairs of 32 target tokens).
SHAPES = {"S": (2048, 8000), "B": (2048, 32000), "smoke": (64, 500)}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def tformer_loss(logits: torch.Tensor, labels: torch.Tensor) -> None:
    _, scaled = scaled_loss(logits, labels, 0.1, 1 / labels.numel())
    scaled.backward()


def torch_loss(logits: torch.Tensor, labels: torch.Tensor) -> None:
    total = F.cross_entropy(
        logits.float(), labels, ignore_index=PAD_ID, label_smoothing=0.1, reduction="sum"
    )
    (total / labels.numel()).backward()


IMPLS: dict[str, Callable[[torch.Tensor, torch.Tensor], None]] = {
    "tformer": tformer_loss,
    "F.cross_entropy": torch_loss,
}


def measure(impl: str, shape: str, precision: str, repeats: int) -> dict[str, object]:
    rows, vocab = SHAPES[shape]
    torch.manual_seed(0)
    leaf = (torch.randn(rows, vocab) * 3).to(DTYPES[precision]).requires_grad_()
    labels = torch.randint(4, vocab, (rows,))
    labels[-rows // 10 :] = PAD_ID  # some padding, as a batch has
    fn = IMPLS[impl]
    times = []
    for i in range(repeats + 2):  # two warm-up rounds
        leaf.grad = None
        start = time.perf_counter()
        fn(leaf, labels)
        if i >= 2:
            times.append((time.perf_counter() - start) * 1000)
    return {"impl": impl, "shape": shape, "precision": precision, "rows": rows, "vocab": vocab,
            "median_ms": round(statistics.median(times), 2), "min_ms": round(min(times), 2),
            "max_ms": round(max(times), 2), "threads": torch.get_num_threads(),
            "torch": torch.__version__}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="S,B")
    parser.add_argument("--precisions", default="fp32,bf16")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--smoke", action="store_true", help="a tiny shape, one repeat (CI)")
    args = parser.parse_args()
    if args.smoke:
        args.shapes, args.repeats = "smoke", 1
    results = []
    for shape in args.shapes.split(","):
        for precision in args.precisions.split(","):
            for impl in IMPLS:
                result = measure(impl, shape, precision, args.repeats)
                print(json.dumps(result), flush=True)
                results.append(result)
    print("\n| shape | precision | implementation | median ms | min | max |")
    print("|---|---|---|---:|---:|---:|")
    for r in results:
        print(f"| {r['shape']} | {r['precision']} | {r['impl']} | {r['median_ms']} | "
              f"{r['min_ms']} | {r['max_ms']} |")  # fmt: skip


if __name__ == "__main__":
    main()
