"""The variant lab on Multi30k: the paper's model against RoPE, SwiGLU, GQA (K = 1, 2) and
RMSNorm + pre-norm, with the same data, tokenizer, seed and step budget, compared side by side.

Trains one shared tokenizer first, then each variant with the ``multi30k`` recipe and
``--max-steps N`` in place of its time budget (the same number of updates for every variant,
so quality is compared at equal steps and speed shows in tokens/s), scores each on a split
with ``tformer evaluate`` (the validation split unless ``--split test``; greedy unless
``--beam-size``), and writes ``tformer compare-runs``' JSON and validation-curve plot plus a
Markdown table to ``--results`` (never the run folders, which stay in ``--out``).

``--time-budget 10m`` trains every run for the same wall-clock time instead (its learning rate
reaching 0 at the end, as the hour's does), the question a recipe for an hour asks: what is
learned in the time, slower steps included. ``--set recipes`` compares the recipes and the
steps between them that chose ``multi30k-pre-swiglu-rope`` (docs/training.md) in place of the
single variants.

Usage: python benchmarks/variant_lab.py [--steps 100 | --time-budget 10m] [--warmup-steps 30]
       [--set variants|recipes] [--split validation|test] [--limit 500] [--seed 1]
       [--results DIR] [--smoke]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
from itertools import islice
from pathlib import Path

from side_by_side import commands_pool, with_threads  # benchmarks/, beside this script

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT.parent / "shared" / "data" / "multi30k"
VARIANTS = {
    "paper": [],
    "rope": ["--positions", "rope"],
    "swiglu": ["--activation", "swiglu"],
    "gqa-1": ["--kv-heads", "1"],
    "gqa-2": ["--kv-heads", "2"],
    "rmsnorm-pre": ["--normalization", "rmsnorm", "--norm", "pre"],
}
# Each run's whole recipe: the plain recipe, then one change at a time towards the one chosen.
RECIPE_STEPS = {
    "multi30k": ["--recipe", "multi30k"],
    "swiglu-rope": ["--recipe", "multi30k-swiglu-rope"],
    "pre-lr2e-3": ["--recipe", "multi30k-swiglu-rope", "--norm", "pre", "--lr", "0.002"],
    "pre-dropout-0.2": ["--recipe", "multi30k-pre-swiglu-rope", "--lr", "0.002",
                        "--dropout", "0.2"],
    "pre-lr3e-3": ["--recipe", "multi30k-pre-swiglu-rope", "--dropout", "0.2"],
    "pre-swiglu-rope": ["--recipe", "multi30k-pre-swiglu-rope"],  # dropout 0.25, chosen in hours
}
SETS = {"variants": VARIANTS, "recipes": RECIPE_STEPS}


def tformer(*args: str, capture: bool = False, threads: int | None = None) -> str:
    """Run a tformer command; ``threads``: its torch threads (default: torch's choice)."""
    print("+ tformer " + " ".join(args), file=sys.stderr, flush=True)
    done = subprocess.run([sys.executable, "-m", "tformer", *args], check=True, cwd=ROOT,
                          capture_output=capture, text=True, env=with_threads(threads))  # fmt: skip
    return done.stdout if capture else ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--time-budget", default=None,
                        help="train each run for this long (e.g. 10m) instead of --steps")
    parser.add_argument("--set", choices=sorted(SETS), default="variants",
                        help="the variants of the paper, or the recipes (each run's own)")
    parser.add_argument("--split", choices=["validation", "test"], default="validation",
                        help="where the runs are scored (choices are made on validation)")
    parser.add_argument("--warmup-steps", type=int, default=30,
                        help="in place of the recipe's 200, so a short budget gets past warm-up")
    parser.add_argument("--limit", type=int, default=500, help="pairs of --split scored")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--beam-size", type=int, default=1)
    parser.add_argument("--out", type=Path, default=ROOT / "checkpoints" / "variant-lab")
    parser.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--smoke", action="store_true",
                        help="two variants on a slice of the bundled data, a tiny model, "
                        "3 steps, side by side (CI)")  # fmt: skip
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    text = ["--data", str(DATA), "--src-lang", "en", "--tgt-lang", "de"]
    chosen = SETS[args.set]
    if args.smoke:
        text = ["--data", str(smoke_data(args.out / "data"))]
        recipe = ["--preset", "tiny", "--recipe", "none", "--max-len", "48"]
        steps, limit, name = 3, ["--limit", "20"], "variant-lab-smoke"
        chosen = {k: VARIANTS[k] for k in ("paper", "gqa-1")}
    else:
        # The recipes set names each run's recipe itself; the variants all change multi30k.
        recipe = [*(["--recipe", "multi30k"] if args.set == "variants" else []),
                  "--warmup-steps", str(args.warmup_steps)]  # fmt: skip
        steps, limit = args.steps, ["--limit", str(args.limit)]
        which = "" if args.set == "variants" else f"{args.set}-"
        name = f"variant-lab-multi30k-{which}{datetime.date.today()}"
    stop = (["--time-budget", args.time_budget] if args.time_budget
            else ["--max-steps", str(steps), "--eval-every", str(max(steps // 2, 1))])
    tokenizer = args.out / "tokenizer.json"
    if not tokenizer.is_file():
        tformer("train-tokenizer", *text, "-o", str(tokenizer))

    # Smoke: the variants train side by side, one a core with one thread each (two trainings
    # of two threads on two cores run 5x slower); otherwise one at a time, so tokens/s compare.
    threads = 1 if args.smoke else None

    def train_and_score(variant: str) -> str:
        run = args.out / variant
        tformer("train", *text, *recipe, "--tokenizer", str(tokenizer), *stop,
                "--seed", str(args.seed), "--val-bleu", "200", *chosen[variant],
                "--out", str(run), "--overwrite", threads=threads)  # fmt: skip
        tformer("evaluate", str(run), *text, "--split", args.split,
                "--beam-size", str(args.beam_size), *limit, threads=threads)  # fmt: skip
        return str(run)

    with commands_pool(args.smoke) as lanes:
        runs = list(lanes.map(train_and_score, chosen))
    args.results.mkdir(parents=True, exist_ok=True)
    plot = str(args.results / f"{name}.png")
    report = json.loads(tformer("compare-runs", *runs, "--json", "--plot", plot, capture=True))
    machine = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"
    report["lab"] = {"steps": None if args.time_budget else steps,
                     "time_budget": args.time_budget, "seed": args.seed,
                     "beam_size": args.beam_size, "split": args.split,
                     "warmup_steps": None if args.smoke else args.warmup_steps,
                     "scored_pairs": 20 if args.smoke else args.limit,
                     "variants": chosen, "machine": machine,
                     "date": str(datetime.date.today())}  # fmt: skip
    (args.results / f"{name}.json").write_text(json.dumps(report, indent=2) + "\n")
    (args.results / f"{name}.md").write_text(markdown(report))
    print(markdown(report))


def smoke_data(folder: Path) -> Path:
    """The first lines of each bundled split: every step of the lab runs, on 20 validation and
    test pairs instead of 1,000 (training ends by translating all of its validation split)."""
    folder.mkdir(parents=True, exist_ok=True)
    for split, lines in (("train", 1000), ("validation", 20), ("test", 20)):
        with open(ROOT / "data" / f"{split}.jsonl") as source:
            (folder / f"{split}.jsonl").write_text("".join(islice(source, lines)))
    return folder


def markdown(report: dict) -> str:
    lab = report["lab"]
    split = lab.get("split", "test")
    budget = (f"{lab['time_budget']} of training" if lab.get("time_budget")
              else f"{lab['steps']} steps")  # fmt: skip
    warmup = f", warm-up {lab['warmup_steps']}" if lab.get("warmup_steps") else ""
    lines = [f"# Variant lab: {budget} each{warmup}, seed {lab['seed']}, "
             f"{lab['machine']}, {lab['date']}", "",
             f"Scored: {lab.get('scored_pairs')} pairs of the {split} split, "
             f"beam {lab['beam_size']}.", "",
             "| run | flags | parameters | steps | tokens/s | best val loss | best val BLEU | "
             f"{split} BLEU | {split} chrF | KV cache B/token |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for run in report["runs"]:
        name = Path(run["path"]).name
        flags = " ".join(lab["variants"].get(name, [])) or "(the paper)"
        scored = (run.get("results") or {}).get(split) or {}
        lines.append(
            f"| {name} | `{flags}` | {run.get('parameters', 0):,} | {run.get('steps', 0):,} | "
            f"{_num(run.get('tokens_per_s'), 0)} | {_num(run.get('best_val_loss'), 3)} | "
            f"{_num(run.get('best_val_bleu'), 2)} | {_num(scored.get('bleu'), 2)} | "
            f"{_num(scored.get('chrf'), 2)} | {_num(run.get('kv_cache_bytes_per_token'), 0)} |"
        )
    return "\n".join(lines) + "\n"


def _num(value: object, digits: int) -> str:
    return f"{value:,.{digits}f}" if isinstance(value, (int, float)) else "-"


if __name__ == "__main__":
    main()
