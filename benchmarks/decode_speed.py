"""Decoding throughput: the key/value cache against re-running the prefix, in ONE run.

Prints one JSON line per measurement, then a Markdown table. Measures new tokens per second
(output tokens of every source, not rows: beam search computes K rows per token) for

- greedy decoding at batch 1 and batch 32, and beam search (4 beams) at batch 1,
- tformer with its key/value cache (``use_cache=True``) and without it (``use_cache=False``:
  every step re-runs the decoder over the whole prefix),
- on a GPU, tformer's cached step replayed as a CUDA graph (the default there) and launched
  kernel by kernel (``tformer-no-graphs``), and beam search at batch 32 as well,
- tformer int8 on a CPU (``tformer-int8``: the same weights through ``quantize_int8``, as
  ``--quantize int8`` loads them; cached only),
- next to Hugging Face ``MarianMTModel`` of the same shape with the same weights copied in
  (``generate`` with ``use_cache`` on and off), when ``transformers`` is importable,
- and next to CTranslate2 with the same weights converted (``translate_batch``, float32 and
  int8 weights, one row each; it always caches, so it has no cache-free row), when
  ``ctranslate2`` is importable, with as many threads (``intra_threads``) as torch.

Both conversions are the product's (``tformer.export``, what ``tformer export`` writes), so
<pad> and <bos> are masked inside the converted models as in tformer, with no decoding option.

Workload: a random-weight model of the "small" preset shape (d_model 256, 4 heads, 3+3
layers, d_ff 1024, vocabulary 8000), sources of 32 random tokens, exactly 64 new tokens per
output (min = max new tokens, so <eos> cannot end a row early). Speeds are the best of
``--repeats`` runs after one warm-up, the variants of a case taking turns; compare them
only within one run. CTranslate2's variants take their turns in a second phase, after the
torch ones: while its translators are alive, torch code in the same process runs about 3x
slower on a 2-core machine.

Like ``train_speed.py``, the run uses ``THP_MEM_ALLOC_ENABLE=1`` (large tensors on transparent
huge pages), the setting tformer makes for itself when imported, for every implementation in
the process, unless the caller's environment says otherwise. Without it the first touch of
each 4 KB page of a fresh large tensor is a page fault: at batch 32 the encoder's 4 MB
feed-forward activations took 7 ms each to fill on a 2-core EPYC, against 1 ms.

On a GPU (``--device cuda``) both torch implementations run there, timed up to a device
synchronisation, and CTranslate2 in float32 on the GPU too, where its build sees one (its
PyPI wheel opens CUDA 12's cuBLAS by name: scripts/gpu-common.sh offers CUDA 13's under those
names on a CUDA 13 machine).

Usage: python benchmarks/decode_speed.py [--shape small|base] [--repeats 3] [--threads N]
       [--device cpu|cuda] [--cache-only] [--smoke]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Before torch loads: torch reads it at its first allocation (see tformer/fast/process.py).
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from tformer.analysis.evaluate import cpu_description  # noqa: E402
from tformer.config import (  # noqa: E402
    BOS_ID,
    EOS_ID,
    PAD_ID,
    SPECIAL_TOKENS,
    ModelConfig,
)
from tformer.decoding.api import decode  # noqa: E402
from tformer.decoding.logits import mask_special_tokens  # noqa: E402
from tformer.decoding.settings import DecodingConfig  # noqa: E402
from tformer.export.ctranslate2 import save_model  # noqa: E402
from tformer.export.huggingface import to_marian  # noqa: E402
from tformer.fast.accelerate import accelerate, plain  # noqa: E402
from tformer.fast.graphs import CUDA_GRAPHS  # noqa: E402
from tformer.fast.int8 import quantize_int8  # noqa: E402
from tformer.model import Transformer  # noqa: E402

SHAPES: dict[str, dict[str, int]] = {
    # The performance issue's shapes: S (tformer's "small" preset) and B (the paper's base).
    "small": dict(d_model=256, n_heads=4, layers=3, d_ff=1024, vocab=8000),
    "base": dict(d_model=512, n_heads=8, layers=6, d_ff=2048, vocab=32000),
    "smoke": dict(d_model=32, n_heads=2, layers=1, d_ff=64, vocab=200),
}


@dataclass(frozen=True)
class Case:
    strategy: str  # "greedy" or "beam4"
    batch: int

    @property
    def beam_size(self) -> int:
        return 4 if self.strategy == "beam4" else 1


# Builds the timed function of one implementation for a case's sources and a cache mode.
MakeRun = Callable[[torch.Tensor, Case, bool], Callable[[], int]]


@dataclass(frozen=True)
class Impl:
    """One implementation under test."""

    make: MakeRun
    caches: tuple[bool, ...] = (True, False)  # the cache modes it has
    extra: dict[str, Any] = field(default_factory=dict)  # added to each of its JSON rows


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
    return accelerate(Transformer(config)).eval()


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


def without_graphs(run: Callable[[], int]) -> Callable[[], int]:
    """``run`` with CUDA-graph steps turned off (``TFORMER_CUDA_GRAPHS=0``) while it runs."""

    def eager() -> int:
        os.environ[CUDA_GRAPHS] = "0"
        try:
            return run()
        finally:
            del os.environ[CUDA_GRAPHS]

    return eager


# -- Hugging Face Marian with the same weights (tformer.export.huggingface.to_marian) ----------


def max_logit_difference(model: Transformer, marian: Any, src: torch.Tensor) -> float:
    """Teacher-forced logits of both models on the same input: should agree to ~1e-5 (the
    export's -inf at <pad> and <bos> is tformer's decoding mask, applied to ours too)."""
    tgt = torch.cat([torch.full((src.size(0), 1), BOS_ID, device=src.device), src[:, :7]], 1)
    with torch.no_grad():
        ours = mask_special_tokens(model(src, tgt).logits.flatten(0, 1))
        theirs = marian(input_ids=src, decoder_input_ids=tgt).logits.flatten(0, 1)
    finite = torch.isfinite(ours)
    if not torch.equal(finite, torch.isfinite(theirs)):
        return float("inf")
    return float((ours[finite] - theirs[finite]).abs().max())


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
                use_cache=cache,  # <pad> and <bos> are never predicted: baked into the export
            )
        return (out.size(1) - 1) * src.size(0)  # minus the decoder start token

    return run


# -- CTranslate2 with the same weights ---------------------------------------------------------

CT2_COMPUTE_TYPES = {"cpu": ("float32", "int8"), "cuda": ("float32",)}


def ct2_token(i: int) -> str:
    """CTranslate2 reads and writes token strings, not ids, so every id needs a unique name:
    tformer's special tokens (ids 0..3) by name, every other id as its decimal string."""
    return SPECIAL_TOKENS[i] if i < len(SPECIAL_TOKENS) else str(i)


def ct2_tokens(ids: torch.Tensor) -> list[list[str]]:
    return [[ct2_token(i) for i in row] for row in ids.tolist()]


def ct2_vocabulary(size: int) -> list[str]:
    return [ct2_token(i) for i in range(size)]


def to_ctranslate2(model: Transformer, output_dir: str) -> None:
    """Write ``model`` to ``output_dir`` as a float32 CTranslate2 model (the product's
    converter, with the token names above in place of a tokenizer's tokens)."""
    vocabulary = ct2_vocabulary(model.config.tgt_vocab_size)
    save_model(model, Path(output_dir), vocabulary, vocabulary)


def ct2_translators(model: Transformer, threads: int, device: str = "cpu") -> dict[str, Any]:
    """One CTranslate2 translator per compute type, all loaded from one conversion of
    ``model`` (on the CPU) and run on ``device``."""
    import ctranslate2

    with tempfile.TemporaryDirectory(prefix="tformer-ct2-") as folder:
        to_ctranslate2(model, folder)
        # The translators read the files now and keep the weights in memory.
        return {
            compute_type: ctranslate2.Translator(
                folder,
                device=device,
                compute_type=compute_type,
                inter_threads=1,
                intra_threads=threads,
            )
            for compute_type in CT2_COMPUTE_TYPES[device]
        }


def ct2_translate(
    translator: Any, tokens: list[list[str]], beam_size: int, new_tokens: int
) -> list[list[str]]:
    """Exactly ``new_tokens`` output tokens per source (min = max: <eos> cannot end one early)."""
    results = translator.translate_batch(
        tokens,
        beam_size=beam_size,  # set always: translate_batch defaults to 2 beams
        num_hypotheses=1,
        min_decoding_length=new_tokens,
        max_decoding_length=new_tokens,
    )
    return [result.hypotheses[0] for result in results]


def ct2_runner(
    translator: Any, src: torch.Tensor, case: Case, new_tokens: int
) -> Callable[[], int]:
    tokens = ct2_tokens(src)  # outside the timed function, as tformer's and HF's id tensors

    def run() -> int:
        return sum(map(len, ct2_translate(translator, tokens, case.beam_size, new_tokens)))

    return run


def ct2_impl(translator: Any, compute_type: str, new_tokens: int) -> Impl:
    import ctranslate2

    return Impl(
        lambda src, case, _cache: ct2_runner(translator, src, case, new_tokens),
        caches=(True,),  # CTranslate2 has no cache-free decoding
        extra={"compute_type": compute_type, "ctranslate2": ctranslate2.__version__},
    )


def ct2_max_logprob_difference(model: Transformer, translator: Any, src: torch.Tensor) -> float:
    """Teacher-forced log-probabilities of both models on the same input (``score_batch``
    scores each target token and the <eos> CTranslate2 appends): should agree to ~1e-5."""
    tgt = src[:, :7]
    with torch.no_grad():
        tgt_in = torch.cat([torch.full((src.size(0), 1), BOS_ID), tgt], dim=1)
        logits = model(src, tgt_in).logits
        logprobs = mask_special_tokens(logits.flatten(0, 1)).view_as(logits).log_softmax(-1)
    gold = torch.cat([tgt, torch.full((src.size(0), 1), EOS_ID)], dim=1)
    ours = logprobs.gather(-1, gold[..., None])[..., 0]
    results = translator.score_batch(ct2_tokens(src), ct2_tokens(tgt))
    theirs = torch.tensor([result.log_probs for result in results])
    return float((ours - theirs).abs().max())


def ct2_same_greedy_share(
    model: Transformer, translator: Any, src: torch.Tensor, new_tokens: int
) -> float:
    """Share of sources whose greedy output, as timed, is token for token tformer's."""
    config = DecodingConfig(min_new_tokens=new_tokens, max_new_tokens=new_tokens)
    ours = [[ct2_token(i) for i in h[0].ids] for h in decode(model, src, config)]
    theirs = ct2_translate(translator, ct2_tokens(src), 1, new_tokens)
    return sum(a == b for a, b in zip(ours, theirs, strict=True)) / len(ours)


# -- measuring --------------------------------------------------------------------------------


def synchronize() -> None:
    """Wait for queued GPU work, so that a timing covers it (a no-op without a GPU)."""
    if torch.cuda.is_initialized():
        torch.cuda.synchronize()


def measure(runs: dict[Any, Callable[[], int]], repeats: int) -> dict[Any, dict[str, float]]:
    """Time every variant ``repeats`` times, round-robin, so that a shared machine's slow
    moments fall on all of them alike; the best time counts."""
    for run in runs.values():
        run()  # warm-up: allocator, lazy initialisation
    synchronize()
    times: dict[Any, list[float]] = {key: [] for key in runs}
    tokens: dict[Any, int] = {}
    for _ in range(repeats):
        for key, run in runs.items():
            start = time.perf_counter()
            tokens[key] = run()
            synchronize()
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


def run_cases(
    impls: dict[str, Impl],
    cases: list[Case],
    length: int,
    vocab: int,
    repeats: int,
    meta: dict[str, Any],
    device: torch.device | None = None,
) -> list[dict[str, Any]]:
    """Measure every variant of ``impls`` on every case; print and return one row each."""
    rows = []
    for case in cases:
        src = sources(case.batch, length, vocab).to(device or "cpu")
        variants = {
            (name, cache): impl.make(src, case, cache)
            for name, impl in impls.items()
            for cache in impl.caches
        }
        for (name, cache), speed in measure(variants, repeats).items():
            row = {
                "impl": name,
                "strategy": case.strategy,
                "batch": case.batch,
                "cache": cache,
                **speed,
                **impls[name].extra,
                **meta,
            }
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def step_weights(model: Transformer) -> list[torch.Tensor]:
    """The matrices one decoding step multiplies by: the decoder's layers (not
    cross-attention's keys and values, made once per source) and the output projection."""
    decoder = [p for name, p in model.named_parameters()
               if name.startswith("decoder.layers.") and p.dim() == 2
               and ".cross_attn.kv_proj." not in name]  # fmt: skip
    out = model.output_projection
    return decoder + [out.weight if out is not None else model.decoder.embedding.embedding.weight]


def weights_ceiling(model: Transformer, repeats: int = 10) -> dict[str, Any]:
    """The fastest any float32 implementation decodes at batch 1 here: each token must read
    every weight of a step once. Timed two ways, the faster kept (best of ``repeats``): one row
    through each matrix in turn, and a sum of each matrix, since a row through torch's own
    product reads at well under the memory's speed on some CPUs (half of it on a Zen 4 EPYC).
    Attention, norms and the search are left out, so no decoder reaches it."""
    weights = [w.detach().float().contiguous() for w in step_weights(model)]
    rows = {width: torch.randn(1, width) for width in {w.size(1) for w in weights}}
    reads = {"row product": lambda w: torch.nn.functional.linear(rows[w.size(1)], w),
             "sum": torch.sum}  # fmt: skip
    timed = {}
    with torch.inference_mode():
        for name, read in reads.items():
            best = float("inf")
            for _ in range(repeats + 1):
                start = time.perf_counter()
                for w in weights:
                    read(w)
                best = min(best, time.perf_counter() - start)
            timed[name] = best
    way, best = min(timed.items(), key=lambda item: item[1])
    size = sum(w.numel() * w.element_size() for w in weights)
    return {"bound": "float32 weights read once a token", "read": way,
            "mb_per_token": round(size / 1e6, 1), "ms_per_token": round(best * 1e3, 2),
            "gb_per_s": round(size / best / 1e9, 1), "tokens_per_s": round(1 / best, 1),
            **{f"ms_{k.replace(' ', '_')}": round(v * 1e3, 2) for k, v in timed.items()}}


def ceiling_line(ceiling: dict[str, Any], reference: float, name: str) -> str:
    return (f"\nThe float32 ceiling here: a token reads the step's {ceiling['mb_per_token']} MB "
            f"of weights at least once, {ceiling['ms_per_token']} ms at "
            f"{ceiling['gb_per_s']} GB/s, so at most {ceiling['tokens_per_s']:.0f} new tokens/s "
            f"at batch 1 ({ceiling['tokens_per_s'] / reference:.2f}x {name}).")


def markdown(rows: list[dict[str, Any]], impls: dict[str, Impl]) -> str:
    """Per implementation: its speed with and without the cache and the cache's speed-up, or
    one column when it only runs with a cache (CTranslate2)."""
    head = ["strategy", "batch"]
    for name, impl in impls.items():
        if False in impl.caches:
            head += [f"{name} cache", f"{name} no cache", f"{name} speed-up"]
        else:
            head.append(name)
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    cases = list(dict.fromkeys((r["strategy"], r["batch"]) for r in rows))
    for strategy, batch in cases:
        cells = [strategy, str(batch)]
        for name, impl in impls.items():
            speed = {
                r["cache"]: r["tokens_per_s"]
                for r in rows
                if (r["impl"], r["strategy"], r["batch"]) == (name, strategy, batch)
            }
            if False not in impl.caches:
                cells.append(f"{speed[True]:.0f}" if True in speed else "-")
                continue
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
    parser.add_argument("--shape", default="small", choices=["small", "base"])
    parser.add_argument(
        "--cache-only",
        action="store_true",
        help="skip the cache-free variants (at shape B they take most of the run's time)",
    )
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = parser.parse_args()
    device = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    shape_name = "smoke" if args.smoke else args.shape
    shape = SHAPES[shape_name]
    length, new_tokens, big_batch = (8, 8, 4) if args.smoke else (32, 64, 32)
    repeats = 1 if args.smoke else args.repeats
    cases = [Case("greedy", 1), Case("greedy", big_batch), Case("beam4", 1)]
    if device.type == "cuda":  # a GPU user's batches: beam search at batch 32 too
        cases.append(Case("beam4", big_batch))

    model = make_model(shape, max_len=max(length, new_tokens) + 1).to(device)
    caches = (True,) if args.cache_only else (True, False)
    impls: dict[str, Impl] = {
        "tformer": Impl(
            lambda src, case, cache: tformer_runner(model, src, case, new_tokens, cache),
            caches=caches,
        )
    }
    if device.type == "cuda":  # the same cached steps launched one kernel at a time
        impls["tformer-no-graphs"] = Impl(
            lambda src, case, cache: without_graphs(
                tformer_runner(model, src, case, new_tokens, cache)
            ),
            caches=(True,),
        )
    if device.type == "cpu":  # --quantize int8: the same weights, quantised on load
        int8_model = quantize_int8(copy.deepcopy(plain(model)))
        accelerate(model)
        impls["tformer-int8"] = Impl(
            lambda src, case, cache: tformer_runner(int8_model, src, case, new_tokens, cache),
            caches=(True,),
        )
    try:
        marian = to_marian(model).to(device)
    except ImportError:
        print(json.dumps({"note": "transformers is not installed: HF Marian skipped"}))
    else:
        check = sources(2, length, shape["vocab"]).to(device)
        ours = decode(model, check, DecodingConfig(max_new_tokens=new_tokens))
        theirs = marian.generate(
            input_ids=check,
            num_beams=1,
            do_sample=False,
            max_new_tokens=new_tokens,
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
        impls["hf-marian"] = Impl(
            lambda src, case, cache: marian_runner(marian, src, case, new_tokens, cache),
            caches=caches,
        )
    meta = {
        "shape": shape_name,
        **shape,
        "source_len": length,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "thp_mem_alloc": os.environ["THP_MEM_ALLOC_ENABLE"],
        "device": device.type,
        **cpu_description(),
        **({"gpu": torch.cuda.get_device_name(device)} if device.type == "cuda" else {}),
    }
    rows = run_cases(impls, cases, length, shape["vocab"], repeats, meta, device)

    # CTranslate2 runs in a second phase, once the torch implementations are measured: while
    # its translators are alive, torch code in the same process ran about 3x slower (two
    # OpenMP runtimes sharing 2 cores), which would have hidden the comparison.
    ct2: Any = None
    try:
        import ctranslate2 as ct2
    except ImportError:
        print(json.dumps({"note": "ctranslate2 is not installed: CTranslate2 skipped"}))
    if ct2 is not None and device.type == "cuda" and ct2.get_cuda_device_count() == 0:
        print(json.dumps({"note": "this CTranslate2 build sees no GPU: CTranslate2 skipped"}))
        ct2 = None
    if ct2 is not None:
        # Converted, and checked against tformer, from a CPU copy of the same weights.
        model = model.cpu() if device.type == "cuda" else model
        translators = ct2_translators(model, torch.get_num_threads(), device.type)
        check = sources(big_batch, length, shape["vocab"])  # the greedy big batch's sources
        # float32 must agree with tformer; int8 is reported to show what quantisation changes.
        note: dict[str, Any] = {
            "note": "CTranslate2 with tformer's weights",
            "ctranslate2": ct2.__version__,
        }
        for compute_type, translator in translators.items():
            note[f"max_logprob_diff_{compute_type}"] = ct2_max_logprob_difference(
                model, translator, check
            )
            note[f"same_greedy_share_{compute_type}"] = ct2_same_greedy_share(
                model, translator, check, new_tokens
            )
        print(json.dumps(note))
        ct2_impls = {
            f"ctranslate2-{compute_type}": ct2_impl(translator, compute_type, new_tokens)
            for compute_type, translator in translators.items()
        }
        rows += run_cases(ct2_impls, cases, length, shape["vocab"], repeats, meta)
        impls.update(ct2_impls)
        del translators, ct2_impls
    print()
    print(
        f"New tokens/s ({shape_name} shape, {new_tokens} new tokens from {length}-token "
        f"sources, {torch.get_num_threads()} threads, best of {repeats}):\n"
    )
    print(markdown(rows, impls))


if __name__ == "__main__":
    main()
