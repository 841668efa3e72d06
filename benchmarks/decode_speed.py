"""Decoding throughput: the key/value cache against re-running the prefix, in ONE run.

Prints one JSON line per measurement, then a Markdown table. Measures new tokens per second
(output tokens of every source, not rows: beam search computes K rows per token) for

- greedy decoding at batch 1 and batch 32, and beam search (4 beams) at batch 1,
- tformer with its key/value cache (``use_cache=True``) and without it (``use_cache=False``:
  every step re-runs the decoder over the whole prefix),
- next to Hugging Face ``MarianMTModel`` of the same shape with the same weights copied in
  (``generate`` with ``use_cache`` on and off), when ``transformers`` is importable.

Workload: a random-weight model of the "small" preset shape (d_model 256, 4 heads, 3+3
layers, d_ff 1024, vocabulary 8000), sources of 32 random tokens, exactly 64 new tokens per
output (min = max new tokens, so <eos> cannot end a row early). Speeds are the best of
``--repeats`` runs after one warm-up, the variants of a case taking turns; compare them
only within one run.

Usage: python benchmarks/decode_speed.py [--repeats 3] [--threads N] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from tformer.config import ModelConfig  # noqa: E402
from tformer.decoding import DecodingConfig, decode  # noqa: E402
from tformer.model import Transformer  # noqa: E402
from tformer.tokenizer import BOS_ID, EOS_ID, PAD_ID  # noqa: E402

SHAPES: dict[str, dict[str, int]] = {
    "small": dict(d_model=256, n_heads=4, layers=3, d_ff=1024, vocab=8000),
    "smoke": dict(d_model=32, n_heads=2, layers=1, d_ff=64, vocab=200),
}


@dataclass(frozen=True)
class Case:
    strategy: str  # "greedy" or "beam4"
    batch: int

    @property
    def beam_size(self) -> int:
        return 4 if self.strategy == "beam4" else 1


def make_model(shape: dict[str, int], max_len: int) -> Transformer:
    torch.manual_seed(0)
    config = ModelConfig(
        src_vocab_size=shape["vocab"],
        tgt_vocab_size=shape["vocab"],
        d_model=shape["d_model"],
        n_heads=shape["n_heads"],
        n_encoder_layers=shape["layers"],
        n_decoder_layers=shape["layers"],
        d_ff=shape["d_ff"],
        dropout=0.0,
        max_len=max_len,
    )
    return Transformer(config).eval()


def sources(batch: int, length: int, vocab: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1)
    return torch.randint(4, vocab, (batch, length), generator=generator)


def tformer_runner(
    model: Transformer, src: torch.Tensor, case: Case, new_tokens: int, cache: bool
) -> Callable[[], int]:
    config = DecodingConfig(
        beam_size=case.beam_size,
        min_new_tokens=new_tokens,
        max_new_tokens=new_tokens,
        use_cache=cache,
    )

    def run() -> int:
        hyps = decode(model, src, config)
        return sum(len(h[0].ids) for h in hyps)

    return run


# -- Hugging Face Marian with the same weights ------------------------------------------------


def to_marian(model: Transformer) -> Any:
    """A ``MarianMTModel`` computing the same function as ``model`` (post-norm, ReLU, tied).

    Marian lays its sinusoidal table out as [sin..., cos...] where tformer interleaves
    sin/cos (the paper's layout), so every d_model axis is permuted to match; LayerNorm is
    indifferent to the order of features, so the two models then agree.
    """
    from transformers import MarianConfig, MarianMTModel  # type: ignore[import-not-found]

    c = model.config
    marian = MarianMTModel(
        MarianConfig(
            vocab_size=c.tgt_vocab_size,
            d_model=c.d_model,
            encoder_layers=c.n_encoder_layers,
            decoder_layers=c.n_decoder_layers,
            encoder_attention_heads=c.n_heads,
            decoder_attention_heads=c.n_heads,
            encoder_ffn_dim=c.d_ff,
            decoder_ffn_dim=c.d_ff,
            activation_function="relu",
            dropout=0.0,
            attention_dropout=0.0,
            activation_dropout=0.0,
            max_position_embeddings=c.max_len,
            scale_embedding=True,
            pad_token_id=PAD_ID,
            eos_token_id=EOS_ID,
            decoder_start_token_id=BOS_ID,
            forced_eos_token_id=None,
            tie_word_embeddings=True,
        )
    ).eval()
    d = c.d_model
    perm = torch.cat([torch.arange(0, d, 2), torch.arange(1, d, 2)])
    ours = model.state_dict()

    def into_residual(prefix: str) -> dict[str, torch.Tensor]:  # reads the residual stream
        return {"weight": ours[f"{prefix}.weight"][:, perm], "bias": ours[f"{prefix}.bias"]}

    def out_of_residual(prefix: str) -> dict[str, torch.Tensor]:  # writes the residual stream
        return {"weight": ours[f"{prefix}.weight"][perm], "bias": ours[f"{prefix}.bias"][perm]}

    def norm(prefix: str) -> dict[str, torch.Tensor]:
        return {"weight": ours[f"{prefix}.weight"][perm], "bias": ours[f"{prefix}.bias"][perm]}

    def attention(src: str) -> dict[str, dict[str, torch.Tensor]]:
        kv_w, kv_b = ours[f"{src}.kv_proj.weight"], ours[f"{src}.kv_proj.bias"]
        return {
            "q_proj": into_residual(f"{src}.q_proj"),
            "k_proj": {"weight": kv_w[:d][:, perm], "bias": kv_b[:d]},
            "v_proj": {"weight": kv_w[d:][:, perm], "bias": kv_b[d:]},
            "out_proj": out_of_residual(f"{src}.out_proj"),
        }

    new: dict[str, torch.Tensor] = {
        "model.shared.weight": ours["encoder.embedding.embedding.weight"][:, perm]
    }

    def put(prefix: str, tree: dict[str, Any]) -> None:
        for name, value in tree.items():
            if isinstance(value, dict):
                put(f"{prefix}.{name}", value)
            else:
                new[f"{prefix}.{name}"] = value

    for i in range(c.n_encoder_layers):
        ours_l, hf = f"encoder.layers.{i}", f"model.encoder.layers.{i}"
        put(
            hf,
            {
                "self_attn": attention(f"{ours_l}.self_attn"),
                "self_attn_layer_norm": norm(f"{ours_l}.norm1"),
                "fc1": into_residual(f"{ours_l}.feed_forward.w1"),
                "fc2": out_of_residual(f"{ours_l}.feed_forward.w2"),
                "final_layer_norm": norm(f"{ours_l}.norm2"),
            },
        )
    for i in range(c.n_decoder_layers):
        ours_l, hf = f"decoder.layers.{i}", f"model.decoder.layers.{i}"
        put(
            hf,
            {
                "self_attn": attention(f"{ours_l}.self_attn"),
                "self_attn_layer_norm": norm(f"{ours_l}.norm1"),
                "encoder_attn": attention(f"{ours_l}.cross_attn"),
                "encoder_attn_layer_norm": norm(f"{ours_l}.norm2"),
                "fc1": into_residual(f"{ours_l}.feed_forward.w1"),
                "fc2": out_of_residual(f"{ours_l}.feed_forward.w2"),
                "final_layer_norm": norm(f"{ours_l}.norm3"),
            },
        )
    missing, unexpected = marian.load_state_dict(new, strict=False)
    assert not unexpected, unexpected
    # Left as Marian made them: the tied copies of the embedding, the fixed position tables
    # and the zero final_logits_bias.
    leftover = [m for m in missing if "embed" not in m and "lm_head" not in m]
    assert leftover == [] or leftover == ["final_logits_bias"], leftover
    return marian


def max_logit_difference(model: Transformer, marian: Any, src: torch.Tensor) -> float:
    """Teacher-forced logits of both models on the same input: should agree to ~1e-5."""
    tgt = torch.cat([torch.full((src.size(0), 1), BOS_ID), src[:, :7]], dim=1)
    with torch.no_grad():
        ours = model(src, tgt).logits
        theirs = marian(input_ids=src, decoder_input_ids=tgt).logits
    return float((ours - theirs).abs().max())


def marian_runner(
    marian: Any, src: torch.Tensor, case: Case, new_tokens: int, cache: bool
) -> Callable[[], int]:
    mask = torch.ones_like(src)

    def run() -> int:
        with torch.no_grad():
            out = marian.generate(
                input_ids=src,
                attention_mask=mask,
                num_beams=case.beam_size,
                do_sample=False,
                min_new_tokens=new_tokens,
                max_new_tokens=new_tokens,
                use_cache=cache,
                suppress_tokens=[PAD_ID, BOS_ID],  # tformer never predicts them either
            )
        return (out.size(1) - 1) * src.size(0)  # minus the decoder start token

    return run


# -- measuring --------------------------------------------------------------------------------


def measure(runs: dict[Any, Callable[[], int]], repeats: int) -> dict[Any, dict[str, float]]:
    """Time every variant ``repeats`` times, round-robin, so that a shared machine's slow
    moments fall on all of them alike; the best time counts."""
    for run in runs.values():
        run()  # warm-up: allocator, lazy initialisation
    times: dict[Any, list[float]] = {key: [] for key in runs}
    tokens: dict[Any, int] = {}
    for _ in range(repeats):
        for key, run in runs.items():
            start = time.perf_counter()
            tokens[key] = run()
            times[key].append(time.perf_counter() - start)
    return {
        key: {
            "new_tokens": tokens[key],
            "seconds_best": min(times[key]),
            "seconds_median": statistics.median(times[key]),
            "tokens_per_s": tokens[key] / min(times[key]),
        }
        for key in runs
    }


def markdown(rows: list[dict[str, Any]], impls: list[str]) -> str:
    head = ["strategy", "batch"]
    for impl in impls:
        head += [f"{impl} cache", f"{impl} no cache", f"{impl} speed-up"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    cases = list(dict.fromkeys((r["strategy"], r["batch"]) for r in rows))
    for strategy, batch in cases:
        cells = [strategy, str(batch)]
        for impl in impls:
            speed = {
                r["cache"]: r["tokens_per_s"]
                for r in rows
                if (r["impl"], r["strategy"], r["batch"]) == (impl, strategy, batch)
            }
            if len(speed) < 2:
                cells += ["-", "-", "-"]
                continue
            cells += [
                f"{speed[True]:.0f}",
                f"{speed[False]:.0f}",
                f"{speed[True] / speed[False]:.1f}x",
            ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    parser.add_argument("--smoke", action="store_true", help="a tiny model, a few tokens")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    shape_name = "smoke" if args.smoke else "small"
    shape = SHAPES[shape_name]
    length, new_tokens, big_batch = (8, 8, 4) if args.smoke else (32, 64, 32)
    repeats = 1 if args.smoke else args.repeats
    cases = [Case("greedy", 1), Case("greedy", big_batch), Case("beam4", 1)]

    model = make_model(shape, max_len=max(length, new_tokens) + 1)
    runners: dict[str, Callable[[torch.Tensor, Case, bool], Callable[[], int]]] = {
        "tformer": lambda src, case, cache: tformer_runner(model, src, case, new_tokens, cache)
    }
    try:
        marian = to_marian(model)
    except ImportError:
        print(json.dumps({"note": "transformers is not installed: HF Marian skipped"}))
    else:
        check = sources(2, length, shape["vocab"])
        ours = decode(model, check, DecodingConfig(max_new_tokens=new_tokens))
        theirs = marian.generate(
            input_ids=check,
            num_beams=1,
            do_sample=False,
            max_new_tokens=new_tokens,
            suppress_tokens=[PAD_ID, BOS_ID],
        )
        same = [h[0].ids for h in ours] == [
            [t for t in row[1:] if t not in (PAD_ID, EOS_ID)] for row in theirs.tolist()
        ]
        note = {
            "note": "HF Marian with tformer's weights",
            "max_logit_diff": max_logit_difference(model, marian, check),
            "same_greedy_output": same,
        }
        print(json.dumps(note))
        runners["hf-marian"] = lambda src, case, cache: marian_runner(
            marian, src, case, new_tokens, cache
        )

    meta = {
        "shape": shape_name,
        **shape,
        "source_len": length,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
    }
    rows = []
    for case in cases:
        src = sources(case.batch, length, shape["vocab"])
        variants = {
            (impl, cache): make(src, case, cache)
            for impl, make in runners.items()
            for cache in (True, False)
        }
        for (impl, cache), speed in measure(variants, repeats).items():
            row = {
                "impl": impl,
                "strategy": case.strategy,
                "batch": case.batch,
                "cache": cache,
                **speed,
                **meta,
            }
            print(json.dumps(row), flush=True)
            rows.append(row)
    print()
    print(
        f"New tokens/s ({shape_name} shape, {new_tokens} new tokens from {length}-token "
        f"sources, {torch.get_num_threads()} threads, best of {repeats}):\n"
    )
    print(markdown(rows, list(runners)))


if __name__ == "__main__":
    main()
