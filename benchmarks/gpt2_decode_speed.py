"""Decoding speed of a GPT-2-small-shaped decoder-only model: tformer against Hugging Face
``generate`` with the same weights, greedy at batch 1.

The model is a ``GPT2LMHeadModel`` of GPT-2 small's published config (124M parameters: 12
layers, d_model 768, 12 heads, 50,257 tokens, 1,024 positions) with random weights, built
locally (no hub), and the same weights mapped into tformer by ``tformer.imports.gpt2`` (what
``tformer import`` does, without a tokenizer: the workload is token ids). Each row decodes a
prompt of ``--prompt`` random tokens to exactly ``--new`` new tokens (min = max, so <eos>
cannot end early) and reports new tokens per second (best of ``--repeats`` after one warm-up,
the implementations taking turns) and the process's peak resident memory after it. Target
(issue 38): tformer at least 2x Hugging Face ``generate`` on 2 CPU cores.

With ``--ablate N`` it then times ``tformer ablate``'s measurement on the same model: every
head (144 for GPT-2 small) masked in turn, the loss of N documents of 16-24 random tokens each,
packed as ``tformer evaluate`` packs them (target: minutes on 2 cores, not hours).

Prints one JSON line per measurement, then a Markdown table.

    python benchmarks/gpt2_decode_speed.py                 # GPT-2 small, 3 repeats
    python benchmarks/gpt2_decode_speed.py --smoke         # a tiny config (CI)
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from decode_speed import ceiling_line, weights_ceiling  # noqa: E402

from tformer.decoding.api import decode_texts  # noqa: E402
from tformer.decoding.settings import DecodingConfig  # noqa: E402
from tformer.fast.accelerate import accelerate  # noqa: E402
from tformer.fast.int8 import quantize_int8  # noqa: E402
from tformer.imports.gpt2 import (  # noqa: E402
    gpt2_model_config,
    gpt2_order,
    gpt2_state,
)
from tformer.imports.weights import open_weights
from tformer.model import Transformer, build_model  # noqa: E402

SMALL: dict[str, Any] = {}  # GPT2Config's defaults are GPT-2 small's
SMOKE = dict(vocab_size=1000, n_positions=64, n_embd=32, n_layer=2, n_head=4, bos_token_id=999,
             eos_token_id=999)


def models(shape: dict[str, Any], seed: int = 0) -> tuple[Any, Transformer, list[int | None]]:
    """The Hugging Face GPT-2 (random weights) and tformer's copy of it (eval mode)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(**shape)
    hf = GPT2LMHeadModel(config).eval()
    order = gpt2_order(config.vocab_size, config.eos_token_id)
    model = build_model(gpt2_model_config(config, len(order)))
    with tempfile.TemporaryDirectory() as folder:
        hf.save_pretrained(folder)
        with open_weights(Path(folder), "transformer.") as saved:
            state = gpt2_state(saved, config, order)
    model.load_state_dict(state, strict=True)
    return hf, model.eval(), order


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def best_times(cases: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Each case's fastest of ``repeats`` runs (seconds), after one warm-up each, the cases
    taking turns so that a change in the machine's speed reaches them all alike."""
    best = {name: float("inf") for name in cases}
    with torch.inference_mode():
        for case in cases.values():
            case()  # warm-up
        for _ in range(repeats):
            for name, case in cases.items():
                start = time.perf_counter()
                case()
                best[name] = min(best[name], time.perf_counter() - start)
    return best


def speed_records(best: dict[str, float], new_tokens: int, **fields: object) -> list[dict]:
    """One record per implementation of ``best`` (seconds for ``new_tokens``), each printed as
    a JSON line: ``fields`` (benchmark, shape, ...), then its tokens/s and the peak RSS."""
    records = []
    for name, seconds in best.items():
        record = {**fields, "implementation": name, "new_tokens": new_tokens,
                  "tokens_per_s": round(new_tokens / seconds, 2),
                  "peak_rss_mb": round(peak_mb(), 1)}  # fmt: skip
        records.append(record)
        print(json.dumps(record), flush=True)
    return records


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    if args.threads:
        torch.set_num_threads(args.threads)
    hf, model, order = models(SMOKE if args.smoke else SMALL)
    eot = hf.config.eos_token_id
    generator = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, eot, (1, args.prompt), generator=generator)  # GPT-2 ids
    ours_prompt = [order.index(int(i)) for i in prompt[0]]
    settings = DecodingConfig(max_new_tokens=args.new, min_new_tokens=args.new)
    hf_prompt = torch.cat([torch.tensor([[eot]]), prompt], dim=1)  # tformer reads <bos> first
    int8 = quantize_int8(models(SMOKE if args.smoke else SMALL)[1])
    accelerate(model)

    def hf_generate() -> None:
        hf.generate(hf_prompt, do_sample=False, max_new_tokens=args.new,
                    min_new_tokens=args.new, pad_token_id=eot)  # fmt: skip

    cases: dict[str, Callable[[], object]] = {
        "huggingface": hf_generate,
        "tformer": lambda: decode_texts(model, [ours_prompt], settings),
        "tformer-int8": lambda: decode_texts(int8, [ours_prompt], settings),
    }
    best = best_times(cases, args.repeats)
    records = speed_records(
        best, args.new, benchmark="gpt2_decode_speed",
        shape="smoke" if args.smoke else "gpt2-small",
        parameters=sum(p.numel() for p in hf.parameters()), threads=torch.get_num_threads(),
        prompt=args.prompt,
    )  # fmt: skip
    ceiling = weights_ceiling(model, args.repeats)  # accelerate keeps the weights it packs
    print(json.dumps({"benchmark": "gpt2_decode_ceiling", **ceiling}), flush=True)
    print(ceiling_line(ceiling, args.new / best["huggingface"], "HF generate"))
    return records


def ablation(model: Transformer, documents: int, seed: int = 2) -> dict[str, Any]:
    """The time ``tformer ablate`` spends ranking every head of ``model`` on ``documents``."""
    from tformer.analysis.ablate import Quality, ablate_with
    from tformer.analysis.evaluate import batches_loss
    from tformer.data.batching import BatchPlan
    from tformer.data.lm import CausalObjective, lm_examples
    from tformer.metrics import EVAL_BATCH_TOKENS
    from tformer.model.heads import all_heads

    rng = torch.Generator().manual_seed(seed)
    vocab = model.config.tgt_vocab_size
    docs = [
        torch.randint(4, vocab, (int(torch.randint(16, 25, (1,), generator=rng)),),
                      generator=rng).tolist()
        for _ in range(documents)
    ]  # fmt: skip
    examples = lm_examples(docs, "decoder-only", model.config.max_len, pack=True)
    plan = BatchPlan(examples, EVAL_BATCH_TOKENS, seed=0, objective=CausalObjective())
    batches = list(plan.batches(0))

    def measure() -> Quality:
        return Quality(round(batches_loss(model, batches)[0], 6))

    start = time.perf_counter()
    with torch.inference_mode():
        result = ablate_with(model, measure, "loss", documents, None, None)
    seconds = time.perf_counter() - start
    record = {
        "benchmark": "gpt2_ablate",
        "heads": len(all_heads(model)),
        "documents": documents,
        "tokens": sum(len(d) + 1 for d in docs),
        "measurements": len(result.effects) + 1,
        "seconds": round(seconds, 1),
        "threads": torch.get_num_threads(),
        "peak_rss_mb": round(peak_mb(), 1),
    }
    print(json.dumps(record), flush=True)
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt", type=int, default=16, help="prompt tokens")
    parser.add_argument("--new", type=int, default=64, help="new tokens per run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's)")
    parser.add_argument("--smoke", action="store_true", help="a tiny config, one repeat (CI)")
    parser.add_argument("--ablate", type=int, default=0, metavar="N",
                        help="also time ablating every head over N documents")  # fmt: skip
    args = parser.parse_args()
    if args.smoke:
        args.repeats, args.new = 1, 8
    records = run(args)
    if args.ablate:
        ablated = ablation(models(SMOKE if args.smoke else SMALL)[1], args.ablate)
        print(f"\nablate: {ablated['heads']} heads over {ablated['documents']} documents "
              f"({ablated['tokens']} tokens) in {ablated['seconds']} s")  # fmt: skip
    hf_speed = next(r["tokens_per_s"] for r in records if r["implementation"] == "huggingface")
    print("\n| implementation | new tokens/s | x Hugging Face | peak RSS (MB, process) |")
    print("|---|---|---|---|")
    for r in records:
        ratio = r["tokens_per_s"] / hf_speed
        print(f"| {r['implementation']} | {r['tokens_per_s']} | {ratio:.2f} | {r['peak_rss_mb']} |")


if __name__ == "__main__":
    main()
