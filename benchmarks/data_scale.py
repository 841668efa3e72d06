"""Training on large corpora: preprocessing speed, memory and start-up time against size.

Generates synthetic parallel corpora (deterministic, written to a scratch folder, never
committed) in the paired-files layout (``train.en`` / ``train.de`` plus small validation
files), about 39 tokens a side as in a real news corpus, trains a tokenizer once on 100,000
pairs (not counted), and measures for each size, with ``wait4``'s peak resident memory:

- ``tformer prepare --data CORPUS --src-lang en --tgt-lang de --tokenizer T --out P``, and the
  same with ``--streaming`` (the text read line by line instead of through an Arrow copy):
  wall seconds and pairs per second (whole command, start-up included);
- ``tformer train --data P --preset tiny --max-steps 20``: seconds from the command's start to
  its first logged step, and peak memory, which should not grow with the corpus;
- at the ``--text-runs`` sizes, ``tformer train`` on the text itself (the id cache filled on
  the way), for comparison.

Prints one JSON line per measurement, then a Markdown table.

Usage: python benchmarks/data_scale.py [--sizes 100000,1000000,5000000] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from side_by_side import commands_pool, with_threads  # benchmarks/, beside this script

ROOT = Path(__file__).resolve().parent.parent
SYLLABLES = ["ka", "to", "ri", "mu", "se", "la", "po", "ne", "vi", "da", "gu", "fe", "zo", "hi"]


def vocabulary(size: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    words: set[str] = set()
    while len(words) < size:
        words.add("".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 4))))
    return sorted(words)


def write_corpus(folder: Path, pairs: int, seed: int = 0, validation: int = 500) -> None:
    """``pairs`` sentence pairs of 8-30 words: source words from a Zipf-like draw, the target a
    fixed word-for-word mapping with the order of each half reversed. Drawn with NumPy a block
    at a time, so five million pairs take about a minute."""
    folder.mkdir(parents=True, exist_ok=True)
    src_words = np.array(vocabulary(20_000, seed), dtype=object)
    tgt_words = np.array(vocabulary(20_000, seed + 1), dtype=object)
    weights = 1.0 / (np.arange(len(src_words)) + 10)
    weights /= weights.sum()
    rng = np.random.default_rng(seed)
    for split, count in (("train", pairs), ("validation", validation)):
        with open(folder / f"{split}.en", "w") as src, open(folder / f"{split}.de", "w") as tgt:
            for start in range(0, count, 100_000):
                rows = min(100_000, count - start)
                lengths = rng.integers(8, 31, size=rows)
                picks = rng.choice(len(src_words), size=int(lengths.sum()), p=weights)
                src_lines, tgt_lines = [], []
                for row in np.split(picks, np.cumsum(lengths)[:-1]):
                    half = len(row) // 2
                    src_lines.append(" ".join(src_words[row]))
                    mapped = np.concatenate([row[:half][::-1], row[half:][::-1]])
                    tgt_lines.append(" ".join(tgt_words[mapped]))
                src.write("\n".join(src_lines) + "\n")
                tgt.write("\n".join(tgt_lines) + "\n")


def train_tokenizer(corpus: Path, out: Path, checkout: Path, vocab_size: int = 8000) -> None:
    code = (
        "import sys; from itertools import islice; "
        "from tformer.data.tokenizer import train_tokenizer; "
        "lines = [l for f in sys.argv[1:3] for l in islice(open(f), 100000)]; "
        "train_tokenizer(lines, vocab_size=int(sys.argv[4])).save(sys.argv[3])"
    )
    args = [str(corpus / "train.en"), str(corpus / "train.de"), str(out), str(vocab_size)]
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    subprocess.run([sys.executable, "-c", code, *args], check=True, env=env, cwd=checkout)


def run(args: list[str], checkout: Path, env: dict[str, str]) -> dict[str, float]:
    """One ``tformer`` command: peak RSS, seconds to its first logged training step (if it
    trains), seconds in all."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tformer", *args], cwd=checkout, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    first = None
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if first is None and line.lstrip().startswith("step "):
            first = time.perf_counter() - start
    _, status, usage = os.wait4(proc.pid, 0)
    total = time.perf_counter() - start
    if status != 0:
        raise SystemExit("".join(lines[-20:]))
    result = {"peak_rss_mb": usage.ru_maxrss / 1024, "total_s": total}
    if first is not None:
        result["first_step_s"] = first
    return result


TRAIN = ["--preset", "tiny", "--log-every", "1"]


def measure(
    corpus: Path,
    tokenizer: Path,
    checkout: Path,
    steps: int,
    scratch: Path,
    text_run: bool,
    batch: tuple[str, ...] = (),
    side_by_side: bool = False,
) -> list[dict[str, object]]:
    """``prepare`` (one process, and with --streaming), ``train`` on the prepared folder, and
    (``text_run``) ``train`` on the text through the id cache; ``batch``: extra train flags;
    ``side_by_side``: two lanes at once (prepare, then train on it; prepare --streaming, then
    train on the text), for the smoke, whose timings are not compared."""
    env = with_threads(1 if side_by_side else None,
                       {**os.environ, "PYTHONPATH": str(checkout),
                        "TFORMER_CACHE": str(scratch / "cache"),
                        "HF_DATASETS_CACHE": str(scratch / "hf")})  # fmt: skip
    data = ["--data", str(corpus), "--src-lang", "en", "--tgt-lang", "de"]
    stop = ["--max-steps", str(steps), "--eval-every", str(steps * 10), *batch]
    prepare = ["prepare", *data, "--tokenizer", str(tokenizer)]
    commands = {
        "prepare": [*prepare, "--out", str(scratch / "prepare")],
        "prepare --streaming": [*prepare, "--out", str(scratch / "prepare--streaming"),
                                "--streaming"],
        "train on the prepared folder": ["train", "--data", str(scratch / "prepare"), *TRAIN,
                                         *stop, "--out", str(scratch / "run-prepared")],
        "train on the text (id cache filled)": ["train", *data, "--tokenizer", str(tokenizer),
                                                *TRAIN, *stop, "--out", str(scratch / "run-text")],
    }  # fmt: skip
    if not text_run:
        del commands["train on the text (id cache filled)"]
    results: dict[str, dict[str, float]] = {}

    def lane(stages: list[str]) -> None:
        for stage in stages:
            if stage in commands:
                results[stage] = run(commands[stage], checkout, env)

    lanes = [["prepare", "train on the prepared folder"],
             ["prepare --streaming", "train on the text (id cache filled)"]]  # fmt: skip
    with commands_pool(side_by_side) as pool:
        list(pool.map(lane, lanes if side_by_side else [list(commands)]))
    return [{"stage": stage, **results[stage]} for stage in commands]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100000,1000000,5000000")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--text-runs", default="100000,1000000",
                        help="sizes at which train on the text is measured too")  # fmt: skip
    parser.add_argument("--scratch", type=Path, default=None)
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="2,000 pairs, 20 validation pairs, 2 small steps, commands side by side (CI)",
    )
    args = parser.parse_args()
    sizes = [2000] if args.smoke else [int(s) for s in args.sizes.split(",")]
    text_runs = {2000} if args.smoke else {int(s) for s in args.text_runs.split(",") if s}
    steps = 2 if args.smoke else args.steps
    rows = []
    for size in sizes:
        with tempfile.TemporaryDirectory(dir=args.scratch) as scratch:
            corpus = Path(scratch) / f"corpus-{size}"
            # Training ends by translating all of the validation split: 20 pairs in smoke.
            write_corpus(corpus, size, validation=20 if args.smoke else 500)
            tokenizer = Path(scratch) / f"tokenizer-{size}.json"
            # Smoke: a smaller vocabulary and batch, so its two steps cost little.
            train_tokenizer(corpus, tokenizer, ROOT, 1000 if args.smoke else 8000)
            batch = ("--max-tokens", "512") if args.smoke else ()
            for result in measure(corpus, tokenizer, ROOT, steps, Path(scratch),
                                  size in text_runs, batch, side_by_side=args.smoke):  # fmt: skip
                row = {"pairs": size, "steps": steps, **result,
                       "pairs_per_s": size / float(result["total_s"]),  # type: ignore[arg-type]
                       "cpu": platform.processor() or platform.machine(),
                       "cores": os.cpu_count()}  # fmt: skip
                print(json.dumps(row), flush=True)
                rows.append(row)
    print(f"\nSynthetic paired files; `train` is `--preset tiny --max-steps {steps}`; pairs/s "
          "is pairs over the command's whole wall time:\n")  # fmt: skip
    print("| pairs | command | peak RSS (MB) | first step (s) | total (s) | pairs/s |")
    print("|---:|---|---:|---:|---:|---:|")
    for r in rows:
        first = f"{r['first_step_s']:.1f}" if "first_step_s" in r else "-"
        print(f"| {r['pairs']:,} | {r['stage']} | {r['peak_rss_mb']:,.0f} | {first} | "
              f"{r['total_s']:.1f} | {r['pairs_per_s']:,.0f} |")  # fmt: skip


if __name__ == "__main__":
    main()
