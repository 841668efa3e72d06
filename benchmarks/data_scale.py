"""Training on large corpora: memory and start-up time against the number of pairs.

Generates synthetic parallel corpora (deterministic, written to a scratch folder, never
committed) in the paired-files layout (``train.en`` / ``train.de`` plus small validation
files), about 39 tokens a side as in a real news corpus, and measures for each size

- ``tformer train --data CORPUS --src-lang en --tgt-lang de --preset tiny --max-steps 20``
  with a tokenizer trained once beforehand (``--tokenizer``), so tokenizer training is not
  counted: the peak resident memory of the process (``wait4``'s ``ru_maxrss``), the seconds
  from the command's start to its first logged training step, and the whole run's seconds;
- preprocessing speed: pairs per second up to the first step (reading, tokenising,
  bucketing; model building included, a constant second or so).

``--ref DIR`` runs the same measurements with the tformer checkout in DIR as well (e.g. a
worktree of an earlier commit), in the same run, for a before/after table.

Prints one JSON line per measurement, then a Markdown table.

Usage: python benchmarks/data_scale.py [--sizes 100000,1000000] [--ref DIR] [--smoke]
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

ROOT = Path(__file__).resolve().parent.parent
SYLLABLES = ["ka", "to", "ri", "mu", "se", "la", "po", "ne", "vi", "da", "gu", "fe", "zo", "hi"]


def vocabulary(size: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    words: set[str] = set()
    while len(words) < size:
        words.add("".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 4))))
    return sorted(words)


def write_corpus(folder: Path, pairs: int, seed: int = 0) -> None:
    """``pairs`` sentence pairs: source words from a Zipf-like draw, the target a fixed
    word-for-word mapping with the order of each clause reversed."""
    folder.mkdir(parents=True, exist_ok=True)
    src_words, tgt_words = vocabulary(20_000, seed), vocabulary(20_000, seed + 1)
    weights = [1.0 / (rank + 10) for rank in range(len(src_words))]
    rng = random.Random(seed)
    for split, count in (("train", pairs), ("validation", 500)):
        with open(folder / f"{split}.en", "w") as src, open(folder / f"{split}.de", "w") as tgt:
            for _ in range(count):
                n = rng.randint(8, 30)
                picks = rng.choices(range(len(src_words)), weights=weights, k=n)
                src.write(" ".join(src_words[i] for i in picks) + "\n")
                half = n // 2
                mapped = [tgt_words[i] for i in picks[:half][::-1] + picks[half:][::-1]]
                tgt.write(" ".join(mapped) + "\n")


def train_tokenizer(corpus: Path, out: Path, checkout: Path) -> None:
    code = (
        "import sys; from itertools import islice; "
        "from tformer.data.tokenizer import train_tokenizer; "
        "lines = [l for f in sys.argv[1:3] for l in islice(open(f), 100000)]; "
        "train_tokenizer(lines, vocab_size=8000).save(sys.argv[3])"
    )
    args = [str(corpus / "train.en"), str(corpus / "train.de"), str(out)]
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    subprocess.run([sys.executable, "-c", code, *args], check=True, env=env, cwd=checkout)


def measure(corpus: Path, tokenizer: Path, checkout: Path, steps: int) -> dict[str, float]:
    """One ``tformer train`` run: peak RSS, seconds to the first step, seconds in all."""
    with tempfile.TemporaryDirectory() as scratch:
        args = [sys.executable, "-m", "tformer", "train", "--data", str(corpus),
                "--src-lang", "en", "--tgt-lang", "de", "--preset", "tiny",
                "--tokenizer", str(tokenizer), "--max-steps", str(steps), "--log-every", "1",
                "--eval-every", str(steps * 10), "--out", f"{scratch}/run"]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(checkout), "TFORMER_CACHE": f"{scratch}/cache"}
        start = time.perf_counter()
        proc = subprocess.Popen(
            args, cwd=checkout, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True,
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
    return {"peak_rss_mb": usage.ru_maxrss / 1024, "first_step_s": first or total,
            "total_s": total}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100000,1000000")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--ref", type=Path, default=None, help="another checkout to compare")
    parser.add_argument("--scratch", type=Path, default=None)
    parser.add_argument("--smoke", action="store_true", help="2,000 pairs, 2 steps")
    args = parser.parse_args()
    sizes = [2000] if args.smoke else [int(s) for s in args.sizes.split(",")]
    steps = 2 if args.smoke else args.steps
    checkouts = {"tformer": ROOT} | ({"reference": args.ref.resolve()} if args.ref else {})
    rows = []
    with tempfile.TemporaryDirectory(dir=args.scratch) as scratch:
        for size in sizes:
            corpus = Path(scratch) / f"corpus-{size}"
            write_corpus(corpus, size)
            tokenizer = Path(scratch) / f"tokenizer-{size}.json"
            train_tokenizer(corpus, tokenizer, ROOT)
            for name, checkout in checkouts.items():
                result = measure(corpus, tokenizer, checkout, steps)
                row = {"checkout": name, "pairs": size, "steps": steps, **result,
                       "pairs_per_s_to_first_step": size / result["first_step_s"],
                       "cpu": platform.processor() or platform.machine(),
                       "cores": os.cpu_count()}  # fmt: skip
                print(json.dumps(row), flush=True)
                rows.append(row)
    print(f"\n`tformer train --preset tiny --max-steps {steps}` on synthetic paired files:\n")
    print("| checkout | pairs | peak RSS (MB) | first step (s) | pairs/s to first step "
          "| total (s) |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['checkout']} | {r['pairs']:,} | {r['peak_rss_mb']:,.0f} | "
              f"{r['first_step_s']:.1f} | {r['pairs_per_s_to_first_step']:,.0f} | "
              f"{r['total_s']:.1f} |")  # fmt: skip


if __name__ == "__main__":
    main()
