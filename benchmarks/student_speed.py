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

Prints one JSON line per measurement, then a Markdown table.

    python benchmarks/student_speed.py
    python benchmarks/student_speed.py --student n_encoder_layers=4,n_decoder_layers=1
    python benchmarks/student_speed.py --smoke     # tiny shapes, one repeat (CI)
"""

from __future__ import annotations

import argparse
import copy
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpt2_decode_speed import best_times, speed_records  # noqa: E402

from tformer.config import ModelConfig  # noqa: E402
from tformer.config.presets import PRESETS, RECIPES  # noqa: E402
from tformer.decoding.api import decode  # noqa: E402
from tformer.decoding.settings import DecodingConfig  # noqa: E402
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


def case(
    model: TransformerBase, src: torch.Tensor, settings: DecodingConfig
) -> Callable[[], object]:
    return lambda: decode(model, src, settings)


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    if args.threads:
        torch.set_num_threads(args.threads)
    built = models(args.smoke, args.student)
    vocab = built["teacher"].config.src_vocab_size
    records = []
    for strategy, batch in CASES:
        generator = torch.Generator().manual_seed(1)
        src = torch.randint(4, vocab, (batch, args.source), generator=generator)
        settings = DecodingConfig(
            beam_size=4 if strategy == "beam4" else 1,
            min_new_tokens=args.new,
            max_new_tokens=args.new,
        )
        runs = {name: case(model, src, settings) for name, model in built.items()}
        best = best_times(runs, args.repeats)
        encoding = best_times({name: partial(model.encode, src) for name, model in built.items()},
                              args.repeats)  # fmt: skip
        for name, seconds in best.items():
            records += speed_records(
                {name: seconds}, args.new * batch, benchmark="student_speed", recipe=RECIPE,
                shape="smoke" if args.smoke else "hour", student=args.student,
                strategy=strategy, batch=batch, source=args.source,
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
    parser.add_argument("--smoke", action="store_true", help="tiny shapes, one repeat (CI)")
    args = parser.parse_args()
    if args.smoke:
        args.repeats, args.new = 1, 4
    records = run(args)
    names = ("teacher", "teacher-int8", "student", "student-int8")
    print("\n| case | " + " | ".join(names) + " | student int8 x teacher | encoder's share "
          "(teacher, student int8) |")
    print("|---|" + "---:|" * (len(names) + 2))
    for strategy, batch in CASES:
        rows = {r["implementation"]: r for r in records
                if r["strategy"] == strategy and r["batch"] == batch}  # fmt: skip
        ratio = rows["student-int8"]["tokens_per_s"] / rows["teacher"]["tokens_per_s"]
        cells = " | ".join(f"{rows[n]['tokens_per_s']:,.0f}" for n in names)
        shares = " / ".join(f"{rows[n]['encode_share']:.0%}" for n in ("teacher", "student-int8"))
        print(f"| {strategy}, batch {batch} | {cells} | {ratio:.2f} | {shares} |")


if __name__ == "__main__":
    main()
