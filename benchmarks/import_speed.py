"""How long `tformer import` takes, and how much memory it peaks at, on a model of
opus-mt-en-de's size (vocabulary 58,101, 6+6 layers, d_model 512, d_ff 2048, swish, shared and
tied embeddings), built locally with random weights: no hub.

The Marian folder is made first (a MarianMTModel saved by save_pretrained, and a
MarianTokenizer whose SentencePiece models are a small trained model grown to the full
vocabulary); then each import runs in a fresh process, which reports its wall time and peak
resident memory, beside the size of the weights (float32). Prints one JSON line per run and
a Markdown table. Targets: under 10 s, and a peak under twice the weights' size.

Then the imported checkpoint decodes, loaded as ``tformer generate`` loads it, next to Hugging
Face ``generate`` on the original MarianMTModel and CTranslate2 on the same weights (the
product's export of the imported checkpoint), float32 and int8 both: new tokens per second,
greedy and beam 4 at batch 1 and greedy at batch 32, 32-token sources, exactly 64 new tokens
(``benchmarks/decode_speed.py``'s method and functions). Target: at least 2x ``generate`` at
batch 1 and at or above CTranslate2 float32.

    python benchmarks/import_speed.py              # the full size, 3 imports
    python benchmarks/import_speed.py --smoke      # tiny sizes (CI)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FULL = dict(vocab=58_101, d_model=512, layers=6, d_ff=2048, heads=8)
SMOKE = dict(vocab=2_000, d_model=32, layers=1, d_ff=64, heads=4)
SEED_LINES = [
    "a man rides a bike down the street .",
    "two dogs play in the snow near a red house .",
    "ein mann fährt mit dem fahrrad die straße hinunter .",
    "zwei hunde spielen im schnee neben einem roten haus .",
] * 50


def spm_model(out: Path, size: int) -> Path:
    """A unigram SentencePiece model of ``size`` pieces: trained on a few lines, then grown
    with made-up pieces (the vocabulary size is what an import's cost depends on)."""
    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2 as model_pb2

    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(SEED_LINES),
        model_prefix=str(out / "seed"),
        vocab_size=40,
        model_type="unigram",
        num_threads=1,
        minloglevel=2,
    )
    proto = model_pb2.ModelProto()
    proto.ParseFromString((out / "seed.model").read_bytes())
    have = {p.piece for p in proto.pieces}
    i = 0
    while len(proto.pieces) < size:
        piece = f"\u2581w{i}"
        i += 1
        if piece not in have:
            proto.pieces.add(piece=piece, score=-20.0 - i * 1e-4, type=1)
    path = out / "grown.model"
    path.write_bytes(proto.SerializeToString())
    return path


def marian_folder(out: Path, sizes: dict[str, int]) -> tuple[Path, int]:
    """A save_pretrained MarianMTModel + MarianTokenizer folder; its parameter count."""
    import torch
    import transformers

    model_file = spm_model(out, sizes["vocab"] - 2)  # + </s> and <pad> in the vocabulary
    from sentencepiece import sentencepiece_model_pb2 as model_pb2

    proto = model_pb2.ModelProto()
    proto.ParseFromString(model_file.read_bytes())
    vocab = {"</s>": 0, "<unk>": 1}
    for p in proto.pieces:
        if p.piece not in vocab and p.piece not in ("<s>",):
            vocab[p.piece] = len(vocab)
    while len(vocab) < sizes["vocab"] - 1:
        vocab[f"\u2581x{len(vocab)}"] = len(vocab)
    vocab["<pad>"] = len(vocab)
    (out / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    folder = out / "marian"
    tokenizer = transformers.MarianTokenizer(
        str(model_file), str(model_file), str(out / "vocab.json")
    )
    tokenizer.save_pretrained(str(folder))
    config = transformers.MarianConfig(
        vocab_size=len(vocab),
        d_model=sizes["d_model"],
        encoder_layers=sizes["layers"],
        decoder_layers=sizes["layers"],
        encoder_attention_heads=sizes["heads"],
        decoder_attention_heads=sizes["heads"],
        encoder_ffn_dim=sizes["d_ff"],
        decoder_ffn_dim=sizes["d_ff"],
        activation_function="swish",
        max_position_embeddings=512,
        scale_embedding=True,
        pad_token_id=vocab["<pad>"],
        eos_token_id=0,
        decoder_start_token_id=vocab["<pad>"],
    )
    torch.manual_seed(0)
    model = transformers.MarianMTModel(config)
    model.save_pretrained(str(folder))
    unique = {p.data_ptr(): p.numel() for p in model.parameters()}
    return folder, sum(unique.values())


CHILD = """
import json, sys, time
from pathlib import Path
import tformer.imports  # the package and its imports first: not part of the import's cost
import torch, transformers, sentencepiece, safetensors
def rss_mb():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20
before = rss_mb()
start = time.perf_counter()
tformer.imports.import_model(sys.argv[1], sys.argv[2])
seconds = time.perf_counter() - start
# VmHWM: this process's own high-water mark (ru_maxrss carries the parent's over exec)
status = open("/proc/self/status").read().split("VmHWM:")[1]
peak = int(status.split()[0]) / 1024
print(json.dumps({"seconds": seconds, "baseline_rss_mb": before, "peak_rss_mb": peak}))
"""


def import_once(folder: Path, out: Path) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(folder), str(out)], capture_output=True, text=True
    )
    if done.returncode != 0:
        sys.exit(f"the import failed:\n{done.stderr.strip()}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def decoding(
    folder: Path, imported: Path, sizes: dict[str, int], *, smoke: bool, device: str = "cpu"
) -> None:
    """The imported model's decoding speed next to HF generate and CTranslate2."""
    import torch
    import transformers

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import decode_speed as bench  # the same cases, timing and table as decode_speed.py

    from tformer.checkpoint.store import load_checkpoint
    from tformer.fast.accelerate import accelerate
    from tformer.fast.int8 import quantize_int8

    length, new_tokens, big = (8, 8, 4) if smoke else (32, 64, 32)
    on = torch.device(device)
    # As `tformer generate` runs it: accelerated (on a GPU, its steps as CUDA graphs).
    model = accelerate(load_checkpoint(imported, "cpu").model.to(on)).eval()
    marian = transformers.MarianMTModel.from_pretrained(str(folder)).eval().to(on)
    impls = {
        "tformer": bench.Impl(
            lambda src, case, cache: bench.tformer_runner(model, src, case, new_tokens, cache),
            caches=(True,),
        ),
        "hf-generate": bench.Impl(
            lambda src, case, cache: bench.marian_runner(marian, src, case, new_tokens, cache),
            caches=(True,),
        ),
    }
    if on.type == "cpu":  # tformer's int8 decoding is a CPU path
        int8 = quantize_int8(load_checkpoint(imported, "cpu").model).eval()
        impls["tformer-int8"] = bench.Impl(
            lambda src, case, cache: bench.tformer_runner(int8, src, case, new_tokens, cache),
            caches=(True,),
        )
    cases = [bench.Case("greedy", 1), bench.Case("beam4", 1), bench.Case("greedy", big)]
    if on.type == "cuda":  # a GPU user's batches: beam search at batch 32 too
        cases.append(bench.Case("beam4", big))
    meta = {"benchmark": "import_decode_speed", "threads": torch.get_num_threads(),
            "torch": torch.__version__, "device": on.type,
            **({"gpu": torch.cuda.get_device_name(on)} if on.type == "cuda" else {}),
            **{f"model_{k}": v for k, v in sizes.items()}}  # fmt: skip
    repeats = 1 if smoke else 3
    rows = bench.run_cases(impls, cases, length, sizes["vocab"], repeats, meta, on)
    ceiling = None
    if on.type == "cpu":  # what memory bandwidth allows any float32 decoder (before CTranslate2)
        ceiling = bench.weights_ceiling(model, repeats)  # accelerate keeps the weights
        print(json.dumps({**meta, "benchmark": "import_decode_ceiling", **ceiling}), flush=True)
    try:
        import ctranslate2
    except ImportError:
        print(json.dumps({"note": "ctranslate2 is not installed: CTranslate2 skipped"}))
    else:  # after the torch ones, as decode_speed.py does (two OpenMP runtimes slow each other)
        if on.type == "cuda" and ctranslate2.get_cuda_device_count() == 0:
            print(json.dumps({"note": "this CTranslate2 build sees no GPU: CTranslate2 skipped"}))
            translators = {}
        else:
            # The product's export of the imported checkpoint, read from a CPU copy.
            weights = load_checkpoint(imported, "cpu").model.eval()
            translators = bench.ct2_translators(weights, torch.get_num_threads(), on.type)
        ct2 = {
            f"ctranslate2-{kind}": bench.ct2_impl(translator, kind, new_tokens)
            for kind, translator in translators.items()
        }
        rows += bench.run_cases(ct2, cases, length, sizes["vocab"], repeats, meta)
        impls.update(ct2)
    print(f"\nNew tokens/s of the imported model ({new_tokens} new tokens, {length}-token "
          f"sources, {torch.get_num_threads()} threads, best of {repeats}):\n")  # fmt: skip
    print(bench.markdown(rows, impls))
    if ceiling is not None:
        hf_greedy = next(r["tokens_per_s"] for r in rows if (r["impl"], r["strategy"],
                         r["batch"]) == ("hf-generate", "greedy", 1))  # fmt: skip
        print(bench.ceiling_line(ceiling, hf_greedy, "HF generate greedy"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, one run (CI)")
    parser.add_argument("--repeats", type=int, default=3, help="imports of the same folder")
    parser.add_argument(
        "--device", default="cpu", choices=["cpu", "cuda"], help="where the decoding runs"
    )
    args = parser.parse_args()
    sizes = SMOKE if args.smoke else FULL
    repeats = 1 if args.smoke else args.repeats
    rows = []
    with tempfile.TemporaryDirectory(prefix="import-speed-") as tmp:
        root = Path(tmp)
        built = time.perf_counter()
        folder, params = marian_folder(root, sizes)
        print(f"built the Marian folder in {time.perf_counter() - built:.1f} s", file=sys.stderr)
        weights_mb = params * 4 / 2**20
        for run in range(repeats):
            result = import_once(folder, root / f"out-{run}")
            grown = result["peak_rss_mb"] - result["baseline_rss_mb"]
            record = {
                "benchmark": "import_speed",
                **{f"model_{k}": v for k, v in sizes.items()},
                "parameters": params,
                "weights_mb": round(weights_mb, 1),
                "run": run,
                "seconds": round(result["seconds"], 2),
                "baseline_rss_mb": round(result["baseline_rss_mb"], 1),
                "peak_rss_mb": round(result["peak_rss_mb"], 1),
                "peak_over_weights": round(grown / weights_mb, 2),
            }
            print(json.dumps(record), flush=True)
            rows.append(record)
        decoding(folder, root / "out-0", sizes, smoke=args.smoke, device=args.device)
    print("\n| run | seconds | weights MB | peak RSS MB (baseline) | peak growth / weights |")
    print("|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['run']} | {r['seconds']} | {r['weights_mb']} | {r['peak_rss_mb']} "
            f"({r['baseline_rss_mb']}) | {r['peak_over_weights']} |"
        )


if __name__ == "__main__":
    main()
