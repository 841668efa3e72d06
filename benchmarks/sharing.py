"""Two tformer processes on one machine: training alone, and training while `generate` runs.

The common case this measures: a user runs ``tformer generate`` (or ``evaluate``) on a
checkpoint while training goes on. Both are the real command line, each in its own process.

For each thread and wait policy (environment settings given to BOTH processes):
- train alone: ``tformer train --preset tiny`` on the bundled data for ``--seconds``; its speed
  is the median of the target+source tokens/s it logs (the first log line, warm-up, left out);
- generate alone: ``tformer generate CKPT --input-file`` (1,000 test sources) again and again
  for ``--seconds``; its speed is sentences per second over the runs that finished, start-up
  included, as a user sees it;
- both at once: the two loops above side by side for the same time;
- two trainings at once: two copies of the training run side by side (their mean tokens/s).
A policy passes when each process keeps at least a third of its solo speed.

Prints one JSON line per measurement, then a Markdown table.

Usage: python benchmarks/sharing.py [--seconds 60] [--policies tformer,torch,...] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from itertools import islice
from pathlib import Path

from tformer.device import cpuinfo

ROOT = Path(__file__).resolve().parent.parent
TFORMER = [sys.executable, "-c", "from tformer.cli import main; main()"]

# Each policy is the environment both processes start with; "tformer" is what the command line
# chooses for itself (tformer.fast.sharing), "torch" switches that off and leaves torch's own;
# the others are the fixed policies it was chosen over.
POLICIES: dict[str, dict[str, str]] = {
    "tformer": {},
    "torch": {"TFORMER_CPU_SHARING": "0"},
    "passive": {"TFORMER_CPU_SHARING": "0", "OMP_WAIT_POLICY": "PASSIVE"},
    "spin-1k": {"TFORMER_CPU_SHARING": "0", "GOMP_SPINCOUNT": "1000"},
    "spin-10k": {"TFORMER_CPU_SHARING": "0", "GOMP_SPINCOUNT": "10000"},
    "spin-100k": {"TFORMER_CPU_SHARING": "0", "GOMP_SPINCOUNT": "100000"},
    "one-thread": {"TFORMER_CPU_SHARING": "0", "OMP_NUM_THREADS": "1"},
}


def environment(policy: str) -> dict[str, str]:
    owned = {"OMP_WAIT_POLICY", "OMP_NUM_THREADS", "GOMP_SPINCOUNT", "TFORMER_CPU_SHARING"}
    env = {k: v for k, v in os.environ.items() if k not in owned}
    env.update(POLICIES[policy])
    env["PYTHONPATH"] = str(ROOT)
    return env


def train_loop(
    run: Path, seconds: float, env: dict[str, str], data: list[str], log_every: int = 5
) -> float:
    """Median tokens/s of a tiny training run that lasts ``seconds``."""
    subprocess.run(
        [*TFORMER, "train", *data, "--preset", "tiny", "--out", str(run), "--overwrite",
         "--time-budget", f"{int(seconds)}s", "--max-steps", "1000000", "--log-every",
         str(log_every), "--eval-every", "1000000", "--save-every", "1000000", "--seed", "0"],
        env=env, check=True, capture_output=True,
    )  # fmt: skip
    rates = [
        record["tokens_per_s"]
        for line in (run / "metrics.jsonl").read_text().splitlines()
        if "tokens_per_s" in (record := json.loads(line))
    ]
    return statistics.median(rates[1:] or rates)


def run_until(command: list[str], env: dict[str, str], stop: threading.Event | float) -> bool:
    """Run ``command`` to its end (True), or stop it as ``stop`` (an event) is set (False)."""
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)  # fmt: skip
    while True:
        try:
            _, errors = proc.communicate(timeout=0.1)
            break
        except subprocess.TimeoutExpired:
            if isinstance(stop, threading.Event) and stop.is_set():
                proc.kill()
                proc.communicate()
                return False
    if proc.returncode:
        raise subprocess.CalledProcessError(proc.returncode, command, stderr=errors)
    return not (isinstance(stop, threading.Event) and stop.is_set())


def generate_loop(
    checkpoint: Path,
    inputs: Path,
    stop: threading.Event | float,
    env: dict[str, str],
    limit: list[str],
) -> float:
    """Sentences/s of repeated ``tformer generate`` runs until ``stop`` (an event or seconds);
    ``limit``: extra flags (the smoke's cap on new tokens)."""
    count = len(inputs.read_text().splitlines())
    deadline = time.monotonic() + stop if isinstance(stop, float) else None
    done, spent = 0, 0.0
    while True:
        if deadline is not None and time.monotonic() >= deadline:
            break
        if isinstance(stop, threading.Event) and stop.is_set():
            break
        start = time.monotonic()
        if not run_until([*TFORMER, "generate", str(checkpoint), "--input-file", str(inputs),
                          *limit], env, stop):  # fmt: skip
            break  # a run that overlapped the end of training is not a shared run
        done, spent = done + count, spent + time.monotonic() - start
    return done / spent if spent else float("nan")


def measure(
    policy: str,
    folder: Path,
    checkpoint: Path | None,
    inputs: Path,
    seconds: float,
    data: list[str],
    log_every: int = 5,
) -> dict:
    """``checkpoint``: the one ``generate`` runs, or None for the "train alone" run's (the
    smoke's: a few seconds of training, saved as it ends)."""
    env = environment(policy)
    # Smoke: an untrained checkpoint translates up to --max-new-tokens, 128 by default.
    limit = ["--max-new-tokens", "8"] if data else []
    train_alone = train_loop(folder / f"{policy}-alone", seconds, env, data, log_every)
    checkpoint = checkpoint or folder / f"{policy}-alone"
    generate_alone = generate_loop(checkpoint, inputs, seconds, env, limit)
    stop = threading.Event()
    shared: dict[str, float] = {}
    generator = threading.Thread(
        target=lambda: shared.update(generate=generate_loop(checkpoint, inputs, stop, env, limit))
    )
    generator.start()
    try:
        shared["train"] = train_loop(folder / f"{policy}-shared", seconds, env, data, log_every)
    finally:
        stop.set()
        generator.join()
    pair: list[float] = []
    other = threading.Thread(
        target=lambda: pair.append(train_loop(folder / f"{policy}-pair-b", seconds, env, data,
                                              log_every))
    )  # fmt: skip
    other.start()
    pair.append(train_loop(folder / f"{policy}-pair-a", seconds, env, data, log_every))
    other.join()
    return {
        "policy": policy,
        "train_alone_tokens_per_s": round(train_alone),
        "train_shared_tokens_per_s": round(shared["train"]),
        "train_kept": round(shared["train"] / train_alone, 3),
        "generate_alone_sentences_per_s": round(generate_alone, 1),
        "generate_shared_sentences_per_s": round(shared["generate"], 1),
        "generate_kept": round(shared["generate"] / generate_alone, 3),
        "two_trainings_tokens_per_s": round(statistics.mean(pair)),
        "two_trainings_kept": round(statistics.mean(pair) / train_alone, 3),
    }


def prepare(folder: Path, data: Path | None = None, steps: int = 100) -> tuple[Path | None, Path]:
    """A tiny checkpoint trained on ``data`` (default: the bundled data; none when ``steps`` is
    0) and its test sources as an input file."""
    checkpoint = folder / "checkpoint"
    flags = ["--data", str(data)] if data else []
    if steps:
        subprocess.run(
            [*TFORMER, "train", *flags, "--preset", "tiny", "--max-steps", str(steps),
             "--out", str(checkpoint)],
            env=environment("tformer"), check=True, capture_output=True,
        )  # fmt: skip
    inputs = folder / "inputs.txt"
    lines = ((data or ROOT / "data") / "test.jsonl").read_text().splitlines()
    inputs.write_text("".join(json.loads(line)["source"] + "\n" for line in lines))
    return checkpoint if steps else None, inputs


def smoke_data(folder: Path) -> Path:
    """The first lines of each bundled split: the same commands on 20 validation and test pairs
    instead of 1,000 (training ends by translating all of its validation split)."""
    folder.mkdir(parents=True, exist_ok=True)
    for split, lines in (("train", 1000), ("validation", 20), ("test", 20)):
        with open(ROOT / "data" / f"{split}.jsonl") as source:
            (folder / f"{split}.jsonl").write_text("".join(islice(source, lines)))
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="1 s on a slice of the bundled data, tformer's policy only (CI)",
    )
    args = parser.parse_args()
    if args.smoke:
        args.seconds, args.policies = 1.0, "tformer"
    machine = cpuinfo().get("model name") or platform.processor() or platform.machine()
    print(json.dumps({"machine": machine, "cores": os.cpu_count(),
                      "date": time.strftime("%Y-%m-%d")}))  # fmt: skip
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        # Smoke: generate runs the "train alone" run's checkpoint (one training fewer), and a
        # log line every step, so 1 s gives a median.
        data = smoke_data(Path(tmp) / "data") if args.smoke else None
        checkpoint, inputs = prepare(Path(tmp), data, steps=0 if args.smoke else 100)
        flags = ["--data", str(data)] if data else []
        for policy in args.policies.split(","):
            row = measure(policy, Path(tmp), checkpoint, inputs, args.seconds, flags,
                          log_every=1 if args.smoke else 5)  # fmt: skip
            print(json.dumps(row), flush=True)
            rows.append(row)
    print()
    print("| policy | train alone tok/s | train shared tok/s | kept | "
          "generate alone sent/s | generate shared sent/s | kept | two trainings tok/s each | "
          "kept |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['policy']} | {r['train_alone_tokens_per_s']:,} | "
              f"{r['train_shared_tokens_per_s']:,} | {r['train_kept']:.0%} | "
              f"{r['generate_alone_sentences_per_s']} | {r['generate_shared_sentences_per_s']} | "
              f"{r['generate_kept']:.0%} | {r['two_trainings_tokens_per_s']:,} | "
              f"{r['two_trainings_kept']:.0%} |")  # fmt: skip


if __name__ == "__main__":
    main()
