"""Decoding speed of a distillation student against its teacher, at the hour recipe's shape.

Teacher: the model of the ``multi30k-pre-swiglu-rope`` recipe (the Multi30k hour: 3 + 3
layers, d_model 256, SwiGLU, RoPE, pre-norm, 8,000 shared tokens). Student: ``--preset
student`` over the same recipe (6 + 1 layers, the same width), as docs/distill.md trains it.
Weights are random: every source is translated to exactly ``--new`` tokens (min = max), so
the work per row does not depend on what the weights say. Sources are ``--source`` random
ids (test2016's English sentences are about 13 words).

Each case (beam 4 at batch 1, greedy and beam 4 at batch 32) runs four rows, taking turns,
best of ``--repeats`` after a warm-up: teacher and student, each in float32 and in int8
(``--quantize int8``). ``x teacher`` is a row's new tokens/s over the float32 teacher's in the
same case: docs/distill.md's target asks the int8 student for at least 3. Each row also times
the encoder alone on the case's sources (``encode_share``: its part of the whole decode), which
a deep encoder makes the larger part at a large batch. ``--student`` sets another student shape
over the recipe, for choosing one (docs/distill.md).

``--shortlist FILE --checkpoint CKPT --sources TEXT`` adds two rows, the student in float32 and
int8 decoding over the lexical shortlist FILE (``tformer shortlist`` of CKPT, whose vocabulary
the recipe's shape shares), and every row then reads the first sentences of TEXT, encoded with
CKPT's tokenizer (a shortlist's candidates depend on the words of a batch): the sentences
around the median length, as ``decode_texts`` batches sentences of similar length.

Prints one JSON line per measurement, then a Markdown table.

    python benchmarks/student_speed.py
    python benchmarks/student_speed.py --student n_encoder_layers=4,n_decoder_layers=1
    python benchmarks/student_speed.py --shortlist SL --checkpoint CKPT --sources test2016.en
    python benchmarks/student_speed.py --smoke     # tiny shapes, one repeat (CI)
"""

from __future__ import annotations

import argparse
import copy
import functools
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpt2_decode_speed import best_times, speed_records  # noqa: E402

from tformer.checkpoint.store import load_checkpoint  # noqa: E402
from tformer.config import ModelConfig  # noqa: E402
from tformer.config.presets import PRESETS, RECIPES  # noqa: E402
from tformer.data.batching import pad  # noqa: E402
from tformer.decoding.api import decode  # noqa: E402
from tformer.decoding.ensemble import Decodable, Ensemble  # noqa: E402
from tformer.decoding.settings import DecodingConfig  # noqa: E402
from tformer.decoding.shortlist import load_shortlist  # noqa: E402
from tformer.fast.accelerate import accelerate  # noqa: E402
from tformer.fast.int8 import quantize_int8  # noqa: E402
from tformer.model import Transformer, TransformerBase  # noqa: E402

RECIPE = "multi30k-pre-swiglu-rope"
VOCAB = 8000  # tformer's default shared vocabulary, which the recipe keeps
CASES = (("beam4", 1), ("greedy", 32), ("beam4", 32))
SMOKE = dict(d_model=32, n_heads=2, d_ff=64)


def student_shape(text: str) -> dict[str, int]:
    """``n_encoder_layers=4,d_ff=512``: whole-number model fields over the recipe's model."""
    fields = {}
    for item in filter(None, text.split(",")):
        name, _, value = item.partition("=")
        if name not in ModelConfig.__dataclass_fields__ or not value.isdigit():
            raise SystemExit(f"--student {text!r}: {item!r} is not FIELD=NUMBER of a model")
        fields[name] = int(value)
    return fields


def shapes(smoke: bool, student: dict[str, int]) -> dict[str, ModelConfig]:
    """The teacher's and the student's configs: the recipe's model, then the student's shape
    (the student preset's layers unless given) over it."""
    values = {**RECIPES[RECIPE]["model"], "src_vocab_size": VOCAB, "tgt_vocab_size": VOCAB}
    if smoke:
        values.update(SMOKE, src_vocab_size=200, tgt_vocab_size=200)
    return {
        "teacher": ModelConfig(**values),
        "student": ModelConfig(**{**values, **student}),
    }


def models(smoke: bool, student: dict[str, int]) -> dict[str, TransformerBase]:
    """teacher, teacher-int8, student, student-int8: accelerated, in eval mode."""
    out: dict[str, TransformerBase] = {}
    for name, config in shapes(smoke, student).items():
        torch.manual_seed(0)
        model = Transformer(config).eval()
        out[f"{name}-int8"] = quantize_int8(copy.deepcopy(model))
        out[name] = accelerate(model)
    return {name: out[name] for name in ("teacher", "teacher-int8", "student", "student-int8")}


def with_shortlist(built: dict[str, TransformerBase], args: argparse.Namespace) -> dict[str, Any]:
    """The rows, with the students over ``--shortlist`` added when it is given."""
    rows: dict[str, Decodable] = dict(built)
    if args.shortlist is not None:
        shortlist = load_shortlist(args.shortlist)
        for name in ("student", "student-int8"):
            rows[f"{name}-shortlist"] = Ensemble([built[name]], shortlist=shortlist)
    return rows


def sources(args: argparse.Namespace, batch: int, vocab: int) -> torch.Tensor:
    """(batch, S) source ids: random, or the ``batch`` sentences of ``--sources`` around the
    median length in CKPT's tokenizer (decode_texts batches sentences sorted by length)."""
    if args.sources is None:
        generator = torch.Generator().manual_seed(1)
        return torch.randint(4, vocab, (batch, args.source), generator=generator)
    encoded = source_ids(args.checkpoint, args.sources)
    start = max(0, len(encoded) // 2 - batch // 2)
    return pad(encoded[start : start + batch])


@functools.cache
def source_ids(checkpoint: Path, text: Path) -> list[list[int]]:
    """``text``'s lines in ``checkpoint``'s source tokenizer, shortest first (read once)."""
    tokenizer = load_checkpoint(checkpoint, torch.device("cpu")).tokenizers.source
    lines = text.read_text(encoding="utf-8").splitlines()
    return sorted(tokenizer.encode_batch(lines), key=len)


def case(model: Decodable, src: torch.Tensor, settings: DecodingConfig) -> Callable[[], object]:
    return lambda: decode(model, src, settings)


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    if args.threads:
        torch.set_num_threads(args.threads)
    built = models(args.smoke, args.student)
    rows = with_shortlist(built, args)
    vocab = built["teacher"].config.src_vocab_size
    records = []
    for strategy, batch in CASES:
        src = sources(args, batch, vocab)
        settings = DecodingConfig(
            beam_size=4 if strategy == "beam4" else 1,
            min_new_tokens=args.new,
            max_new_tokens=args.new,
        )
        runs = {name: case(model, src, settings) for name, model in rows.items()}
        best = best_times(runs, args.repeats)
        encoding = best_times({name: partial(model.encode, src) for name, model in built.items()},
                              args.repeats)  # fmt: skip
        encoding.update({name: encoding[name.removesuffix("-shortlist")] for name in rows})
        for name, seconds in best.items():
            records += speed_records(
                {name: seconds}, args.new * batch, benchmark="student_speed", recipe=RECIPE,
                shape="smoke" if args.smoke else "hour", student=args.student,
                strategy=strategy, batch=batch, source=src.size(1),
                threads=torch.get_num_threads(), encode_ms=round(encoding[name] * 1e3, 2),
                encode_share=round(encoding[name] / seconds, 3),
            )  # fmt: skip
    return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=int, default=16, help="source tokens")
    parser.add_argument("--new", type=int, default=16, help="new tokens per source")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's)")
    parser.add_argument("--student", type=student_shape, default=PRESETS["student"],
                        help="the student's model fields over the recipe's, e.g. "
                        "n_encoder_layers=4,n_decoder_layers=1 (default: --preset student)")
    parser.add_argument("--shortlist", type=Path, help="a tformer shortlist file of --checkpoint")
    parser.add_argument("--checkpoint", type=Path, help="whose tokenizer reads --sources")
    parser.add_argument("--sources", type=Path, help="a text file of sources, one a line")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes, one repeat (CI)")
    args = parser.parse_args()
    if (args.shortlist is not None or args.sources is not None) and args.checkpoint is None:
        parser.error("--shortlist and --sources need --checkpoint (its tokenizer)")
    if args.shortlist is not None and args.sources is None:
        parser.error("--shortlist needs --sources: its candidates come from real words")
    if args.smoke:
        args.repeats, args.new = 1, 4
    records = run(args)
    names = ["teacher", "teacher-int8", "student", "student-int8"]
    fastest = "student-int8"
    if args.shortlist is not None:
        names += ["student-shortlist", "student-int8-shortlist"]
        fastest = "student-int8-shortlist"
    print("\n| case | " + " | ".join(names) + f" | {fastest} x teacher | encoder's share "
          f"(teacher, {fastest}) |")
    print("|---|" + "---:|" * (len(names) + 2))
    for strategy, batch in CASES:
        found = {r["implementation"]: r for r in records
                 if r["strategy"] == strategy and r["batch"] == batch}  # fmt: skip
        ratio = found[fastest]["tokens_per_s"] / found["teacher"]["tokens_per_s"]
        cells = " | ".join(f"{found[n]['tokens_per_s']:,.0f}" for n in names)
        shares = " / ".join(f"{found[n]['encode_share']:.0%}" for n in ("teacher", fastest))
        print(f"| {strategy}, batch {batch} | {cells} | {ratio:.2f} | {shares} |")


if __name__ == "__main__":
    main()
