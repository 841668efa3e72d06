"""A noisy copy of a paired-text corpus, for measuring corpus filtering.

Copies every file of a folder of paired text files (``train.en`` / ``train.de`` ...) and, in
the training split only, replaces a share of the targets by another pair's target
(misaligned) and a share by the pair's own source (copied), as crawled corpora hold them.
The other splits stay clean, so what the noise costs is measured on clean data. The labels
go to ``OUT-noise.jsonl`` (one line per training pair) beside the data; ``--judge`` reads
them with a ``tformer filter`` folder's scores.jsonl and prints how many pairs of each kind
the filter dropped.

Usage: python benchmarks/noisy_corpus.py DATA OUT --src en --tgt de
       [--misaligned 0.10] [--copied 0.05] [--seed 0]
       python benchmarks/noisy_corpus.py --judge OUT-noise.jsonl FILTERED/scores.jsonl
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
from pathlib import Path

KINDS = ("clean", "misaligned", "copied")  # the labels, in the order they are reported


def judge(labels_file: Path, scores_file: Path) -> None:
    """Print, per kind of pair, how many the filter kept and dropped, as JSON and a table."""
    labels = [json.loads(line)["noise"] for line in labels_file.read_text().splitlines()]
    kept = [json.loads(line)["kept"] for line in scores_file.read_text().splitlines()]
    if len(labels) != len(kept):
        raise SystemExit(f"{labels_file}: {len(labels)} pairs, {scores_file}: {len(kept)}")
    rows = {}
    for kind in KINDS:
        fates = [k for label, k in zip(labels, kept, strict=True) if label == kind]
        rows[kind] = {"pairs": len(fates), "dropped": fates.count(False)}
    print(json.dumps(rows))
    print("| pairs | in the corpus | dropped |\n|---|---:|---:|")
    for kind, row in rows.items():
        print(f"| {kind} | {row['pairs']:,} | {row['dropped']:,} "
              f"({row['dropped'] / max(row['pairs'], 1):.1%}) |")


def main() -> None:
    if sys.argv[1:2] == ["--judge"]:
        judging = argparse.ArgumentParser(description="How a filter did on a noisy copy")
        judging.add_argument("--judge", nargs=2, type=Path, required=True,
                             metavar=("LABELS", "SCORES"))  # fmt: skip
        judge(*judging.parse_args().judge)
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--src", default="en")
    parser.add_argument("--tgt", default="de")
    parser.add_argument("--split", default="train")
    parser.add_argument("--misaligned", type=float, default=0.10)
    parser.add_argument("--copied", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=False)
    for file in args.data.iterdir():
        if file.is_file() and not file.name.startswith(f"{args.split}."):
            shutil.copy(file, args.out / file.name)
    sources = (args.data / f"{args.split}.{args.src}").read_text().splitlines()
    targets = (args.data / f"{args.split}.{args.tgt}").read_text().splitlines()
    rng = random.Random(args.seed)
    order = list(range(len(sources)))
    rng.shuffle(order)
    n_misaligned = round(args.misaligned * len(order))
    n_copied = round(args.copied * len(order))
    misaligned = set(order[:n_misaligned])
    copied = set(order[n_misaligned : n_misaligned + n_copied])
    noisy, labels = [], []
    for i, (source, target) in enumerate(zip(sources, targets, strict=True)):
        label = "clean"
        if i in misaligned:
            j = rng.randrange(len(targets))
            while targets[j] == target:
                j = rng.randrange(len(targets))
            target, label = targets[j], "misaligned"
        elif i in copied:
            target, label = source, "copied"
        noisy.append(target)
        labels.append(label)
    shutil.copy(args.data / f"{args.split}.{args.src}", args.out / f"{args.split}.{args.src}")
    (args.out / f"{args.split}.{args.tgt}").write_text("\n".join(noisy) + "\n")
    with open(args.out.parent / f"{args.out.name}-noise.jsonl", "w") as labels_file:
        for i, label in enumerate(labels):
            labels_file.write(json.dumps({"index": i, "noise": label}) + "\n")
    counts = {label: labels.count(label) for label in KINDS}
    print(json.dumps({"out": str(args.out), "pairs": len(labels), **counts}))


if __name__ == "__main__":
    main()
