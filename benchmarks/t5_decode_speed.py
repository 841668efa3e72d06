"""Decoding speed of a t5-small-shaped encoder-decoder: tformer against Hugging Face
``generate`` with the same weights, greedy at batch 1.

The model is a ``T5ForConditionalGeneration`` of t5-small's published config (60M parameters:
6 + 6 layers, d_model 512, 8 heads, d_ff 2,048, 32,128 tokens, 32 relative buckets) with random
weights, built locally (no hub), and the same weights mapped into tformer by
``tformer.imports.t5`` (what ``tformer import`` does, without a tokenizer: the workload is
token ids). Each row translates a source of ``--source`` random tokens to exactly ``--new`` new
tokens (min = max, so </s> cannot end early) and reports new tokens per second (best of
``--repeats`` after one warm-up, the implementations taking turns) and the process's peak
resident memory after it.

Rows: Hugging Face ``generate``; tformer's plain cached decode (the path T5 took before the
lean step took its variants); tformer accelerated (the lean step); tformer int8.

Prints one JSON line per measurement, then a Markdown table.

    python benchmarks/t5_decode_speed.py                 # t5-small, 3 repeats
    python benchmarks/t5_decode_speed.py --smoke         # a tiny config (CI)
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpt2_decode_speed import best_times, speed_records  # noqa: E402

from tformer.config import BOS_ID  # noqa: E402
from tformer.decoding.api import decode_texts  # noqa: E402
from tformer.decoding.settings import DecodingConfig  # noqa: E402
from tformer.fast.accelerate import accelerate  # noqa: E402
from tformer.fast.int8 import quantize_int8  # noqa: E402
from tformer.imports.t5 import t5_model_config, t5_order, t5_state  # noqa: E402
from tformer.imports.weights import open_weights
from tformer.model import Transformer, build_model  # noqa: E402

SMALL: dict[str, Any] = dict(vocab_size=32128, d_model=512, d_kv=64, d_ff=2048, num_layers=6,
                             num_heads=8, feed_forward_proj="relu")  # fmt: skip
SMOKE: dict[str, Any] = dict(vocab_size=1000, d_model=32, d_kv=8, d_ff=64, num_layers=2,
                             num_heads=4, relative_attention_num_buckets=8)  # fmt: skip


def models(shape: dict[str, Any], seed: int = 0) -> tuple[Any, Transformer, list[int | None]]:
    """The Hugging Face T5 (random weights) and tformer's copy of it (eval mode)."""
    from transformers import T5Config, T5ForConditionalGeneration

    torch.manual_seed(seed)
    config = T5Config(**shape, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    hf = T5ForConditionalGeneration(config).eval()
    order = t5_order(config.vocab_size)
    model = build_model(t5_model_config(config, len(order)))
    with tempfile.TemporaryDirectory() as folder:
        hf.save_pretrained(folder)
        with open_weights(Path(folder)) as saved:
            state = t5_state(saved, config, order)
    missing = model.load_state_dict(state, strict=False).missing_keys
    assert not [k for k in missing if "positions" not in k], missing
    return hf, model.eval(), order


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    if args.threads:
        torch.set_num_threads(args.threads)
    shape = SMOKE if args.smoke else SMALL
    hf, plain, order = models(shape)
    generator = torch.Generator().manual_seed(1)
    source = torch.randint(3, 1000, (1, args.source), generator=generator)  # T5 ids, no </s>
    ours = [order.index(int(i)) for i in source[0]]  # tformer closes it with </s> itself
    hf_source = torch.cat([source, torch.tensor([[1]])], dim=1)  # T5's tokenizer appends </s>
    settings = DecodingConfig(max_new_tokens=args.new, min_new_tokens=args.new)
    lean = accelerate(models(shape)[1])
    int8 = quantize_int8(models(shape)[1])
    assert BOS_ID == 1  # tformer starts from <bos>, T5 from <pad>: the same row, renumbered

    def hf_generate() -> None:
        hf.generate(hf_source, do_sample=False, max_new_tokens=args.new,
                    min_new_tokens=args.new)  # fmt: skip

    cases: dict[str, Callable[[], object]] = {
        "huggingface": hf_generate,
        "tformer-plain": lambda: decode_texts(plain, [ours], settings),
        "tformer": lambda: decode_texts(lean, [ours], settings),
        "tformer-int8": lambda: decode_texts(int8, [ours], settings),
    }
    best = best_times(cases, args.repeats)
    return speed_records(
        best, args.new, benchmark="t5_decode_speed", shape="smoke" if args.smoke else "t5-small",
        parameters=sum(p.numel() for p in hf.parameters()), threads=torch.get_num_threads(),
        source=args.source,
    )  # fmt: skip

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=int, default=24, help="source tokens")
    parser.add_argument("--new", type=int, default=64, help="new tokens per run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's)")
    parser.add_argument("--smoke", action="store_true", help="a tiny config, one repeat (CI)")
    args = parser.parse_args()
    if args.smoke:
        args.repeats, args.new = 1, 8
    records = run(args)
    hf_speed = next(r["tokens_per_s"] for r in records if r["implementation"] == "huggingface")
    print("\n| implementation | new tokens/s | x Hugging Face | peak RSS (MB, process) |")
    print("|---|---|---|---|")
    for r in records:
        ratio = r["tokens_per_s"] / hf_speed
        print(f"| {r['implementation']} | {r['tokens_per_s']} | {ratio:.2f} | {r['peak_rss_mb']} |")


if __name__ == "__main__":
    main()
