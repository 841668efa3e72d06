"""A noisy copy of a paired-text corpus, for measuring corpus filtering.

Copies every file of a folder of paired text files (``train.en`` / ``train.de`` ...) and, in
the training split only, replaces a share of the targets by another pair's target
(misaligned) and a share by the pair's own source (copied), as crawled corpora hold them.
The other splits stay clean, so what the noise costs is measured on clean data. The labels
go to ``noise.jsonl`` (one line per training pair) beside the data, for scoring a filter
afterwards; ``tformer`` reads only the paired files.

Usage: python benchmarks/noisy_corpus.py DATA OUT --src en --tgt de
       [--misaligned 0.10] [--copied 0.05] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
from pathlib import Path


def main() -> None:
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
    counts = {label: labels.count(label) for label in ("clean", "misaligned", "copied")}
    print(json.dumps({"out": str(args.out), "pairs": len(labels), **counts}))


if __name__ == "__main__":
    main()
