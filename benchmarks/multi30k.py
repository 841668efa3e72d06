"""Multi30k end to end: tokenizer -> train (the ``multi30k`` recipe) -> evaluate on test2016.

Reads ../shared/data/multi30k (never copied into the repo), trains with a wall-clock budget,
averages the kept checkpoints, picks the last / best / averaged model by validation BLEU,
evaluates it on test2016 with sacreBLEU and chrF, and writes the result card to
benchmarks/results/multi30k-<src>-<tgt>-<date>.{json,md}.

Usage: python benchmarks/multi30k.py [--src en --tgt de] [--time-budget 60m] [--data DIR]
       [--recipe multi30k] [--train-args "--d-model 512 ..." --tag wide]
       [--beam-size 4] [--length-penalty 0.6] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import subprocess
import sys
import time
from itertools import islice
from pathlib import Path

from side_by_side import commands_pool, with_threads  # benchmarks/, beside this script

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT.parent / "shared" / "data" / "multi30k"


def run(*args: str, threads: int | None = None) -> None:
    """Run a tformer command; ``threads``: its torch threads (default: torch's choice)."""
    print("+ tformer " + " ".join(args), file=sys.stderr, flush=True)
    subprocess.run([sys.executable, "-m", "tformer", *args], check=True, cwd=ROOT,
                   env=with_threads(threads))  # fmt: skip


def smoke_data(folder: Path, languages: tuple[str, str], data: Path = DATA) -> Path:
    """The first lines of each file of Multi30k, in a scratch folder beside the run: the same
    pipeline on 2,000 training pairs and 20 validation and test pairs (training ends by
    translating all of its validation split, validation BLEU picks the candidate)."""
    folder.mkdir(parents=True, exist_ok=True)
    for file in data.iterdir():
        if file.suffix.lstrip(".") in languages:
            lines = 2000 if file.name.startswith("train") else 20
            with open(file) as source:
                (folder / file.name).write_text("".join(islice(source, lines)))
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", default="en")
    parser.add_argument("--tgt", default="de")
    parser.add_argument("--time-budget", default="60m")
    parser.add_argument("--recipe", default="multi30k", help="the recipe trained (its name "
                        "enters the result card's file name unless it is multi30k)")
    parser.add_argument("--train-args", default="", help="more `tformer train` flags, after "
                        "the recipe's (one quoted string)")
    parser.add_argument("--tag", default=None, help="a name for the run and its result card "
                        "(needed with --train-args, whose model is not the recipe's)")
    parser.add_argument("--out", default=None)
    parser.add_argument("--data", type=Path, default=DATA, help="another copy of Multi30k "
                        "(the same files), such as a noisy one; default ../shared/data/multi30k")
    # Beam search with the paper's length penalty (alpha 0.6), as translation results are
    # usually reported; --beam-size 1 evaluates greedy decoding.
    parser.add_argument("--beam-size", type=int, default=4)
    parser.add_argument("--length-penalty", type=float, default=0.6)
    parser.add_argument("--smoke", action="store_true",
                        help="a few steps on a tiny model, to check the pipeline (CI)")
    args = parser.parse_args()
    if not args.data.is_dir():
        print(json.dumps({"skipped": f"{args.data} is not present"}))
        return
    if args.train_args and not args.tag:
        parser.error("--train-args changes the recipe's run: name it with --tag")
    name = f"multi30k-{args.src}-{args.tgt}"
    if args.recipe != "multi30k":
        name += f"-{args.recipe.removeprefix('multi30k-')}"
    if args.tag:
        name += f"-{args.tag}"
    out = Path(args.out or ROOT / "checkpoints" / name)
    data = args.data
    if args.smoke:
        data = smoke_data(out.parent / f"{name}-smoke-data", (args.src, args.tgt), args.data)
    train = ["train", "--data", str(data), "--src-lang", args.src, "--tgt-lang", args.tgt,
             "--recipe", args.recipe, "--out", str(out), "--overwrite",
             *shlex.split(args.train_args)]
    if args.smoke:
        train += ["--preset", "tiny", "--max-steps", "5", "--eval-every", "5", "--save-every",
                  "5", "--vocab-size", "500"]
    else:
        train += ["--time-budget", args.time_budget]
    started = time.time()
    run(*train)
    steps = sorted(out.glob("step-*"))
    # Candidates: the last checkpoint, the best by validation BLEU, and the average of the
    # kept checkpoints. Averaging helps a converged run and hurts one still improving fast,
    # so the validation split (never the test split) decides which one is tested.
    candidates = {"last": steps[-1] if steps else out, "best": out / "best"}
    if len(steps) >= 2:
        averaged = out.parent / f"{name}-avg"
        shutil.rmtree(averaged, ignore_errors=True)
        run("average", *map(str, steps), "--out", str(averaged))
        candidates["average"] = averaged
    limit = ["--limit", "20", "--max-new-tokens", "10"] if args.smoke else []
    decoding = ["--beam-size", str(args.beam_size), "--length-penalty", str(args.length_penalty)]
    common = ["--data", str(data), "--src-lang", args.src, "--tgt-lang", args.tgt, *decoding,
              *limit]

    def validation_bleu(label: str) -> float:
        where = out / f"eval-validation-{label}"
        run("evaluate", str(candidates[label]), *common, "--split", "validation", "--out",
            str(where), threads=1 if args.smoke else None)  # fmt: skip
        return float(json.loads((where / "result.json").read_text())["metrics"]["bleu"])

    # Smoke: the candidates are scored side by side, one thread each (mostly start-up).
    labels = [label for label, path in candidates.items() if path.is_dir()]
    with commands_pool(args.smoke) as lanes:
        validation = dict(zip(labels, lanes.map(validation_bleu, labels), strict=True))
    chosen = max(validation, key=lambda label: validation[label])
    run("evaluate", str(candidates[chosen]), *common, "--split", "test", "--out",
        str(out / "eval-test2016"))
    card = json.loads((out / "eval-test2016" / "result.json").read_text())
    card["benchmark"] = {"command": " ".join(sys.argv), "total_wall_time_s":
                         round(time.time() - started, 1), "averaged_checkpoints": len(steps),
                         "validation_bleu": validation, "chosen_by_validation": chosen}
    print(json.dumps(card))
    if not args.smoke:
        stamp = time.strftime("%Y-%m-%d")
        results = ROOT / "benchmarks" / "results"
        results.mkdir(parents=True, exist_ok=True)
        (results / f"{name}-{stamp}.json").write_text(json.dumps(card, indent=2) + "\n")
        shutil.copy(out / "eval-test2016" / "result.md", results / f"{name}-{stamp}.md")


if __name__ == "__main__":
    main()
