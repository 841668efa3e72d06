"""`tformer shrink`: a model with fewer layers, started from a checkpoint's own.

The student's layer ``i`` of a shrunk stack is the teacher's layer ``spread(...)[i]``, every
other weight and the tokenizer are the teacher's: checked tensor for tensor, and by running the
teacher's own modules with only the chosen layers, which must give the student's logits.
"""

from __future__ import annotations

import copy
import hashlib
from pathlib import Path

import pytest
import torch
from torch import nn
from typer.testing import CliRunner

from tformer import checkpoint as ckpt
from tformer.checkpoint.shrinking import spread
from tformer.cli.commands import app
from tformer.config import ModelConfig, TrainConfig
from tformer.data.tokenizer import train_tokenizer
from tformer.model import build_model

runner = CliRunner()
TEXTS = ["the cat sat on the mat", "a dog ran in the park", "3 1 4 1 5 9 2 6"] * 30


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def files(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): sha(p) for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def teacher(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 4 + 3 layer pre-norm model with random weights, saved as a run."""
    tokenizer = train_tokenizer(TEXTS, vocab_size=50)
    config = ModelConfig(
        src_vocab_size=tokenizer.vocab_size,
        tgt_vocab_size=tokenizer.vocab_size,
        d_model=16,
        n_heads=2,
        n_encoder_layers=4,
        n_decoder_layers=3,
        d_ff=32,
        max_len=32,
        norm="pre",
        dropout=0.0,
    )
    torch.manual_seed(0)
    model = build_model(config).eval()
    run = tmp_path_factory.mktemp("shrink") / "teacher"
    ckpt.save_checkpoint(
        run,
        model=model,
        train_config=TrainConfig(),
        tokenizers=ckpt.Tokenizers(tokenizer, tokenizer),
        step=7,
    )
    return run


def shrink(teacher: Path, out: Path, *args: str) -> ckpt.Checkpoint:
    result = runner.invoke(app, ["shrink", str(teacher), "--out", str(out), *args])
    assert result.exit_code == 0, result.output
    return ckpt.load_checkpoint(out)


@pytest.mark.parametrize(
    ("kept", "layers", "chosen"),
    # Shleifer & Rush's table for 12 layers: 1 -> [0], 3 -> [0, 6, 11], 6 -> [0, 2, 4, 7, 9, 11].
    [(1, 12, [0]), (3, 12, [0, 6, 11]), (6, 12, [0, 2, 4, 7, 9, 11]), (2, 3, [0, 2]),
     (3, 3, [0, 1, 2]), (1, 1, [0])],  # fmt: skip
)
def test_spread_keeps_the_first_and_last_and_spaces_the_rest(
    kept: int, layers: int, chosen: list[int]
) -> None:
    assert spread(kept, layers) == chosen


def test_the_student_holds_the_chosen_layers_and_the_rest_of_the_teacher(
    teacher: Path, tmp_path: Path
) -> None:
    student = shrink(teacher, tmp_path / "student", "--n-encoder-layers", "2",
                     "--n-decoder-layers", "1")  # fmt: skip
    big = ckpt.load_checkpoint(teacher)
    assert student.step == 0
    assert (student.model_config.n_encoder_layers, student.model_config.n_decoder_layers) == (2, 1)
    assert student.model_config.d_model == big.model_config.d_model
    weights, theirs = student.model.state_dict(), big.model.state_dict()
    layer_map = {"encoder": spread(2, 4), "decoder": spread(1, 3)}  # [0, 3] and [0]
    for name, tensor in weights.items():
        stack, _, rest = name.partition(".layers.")
        if rest:
            index, _, tail = rest.partition(".")
            name = f"{stack}.layers.{layer_map[stack][int(index)]}.{tail}"
        assert torch.equal(tensor, theirs[name]), name
    assert sha(student.path / "tokenizer.json") == sha(big.path / "tokenizer.json")

    # The teacher's own modules with only those layers compute what the student computes.
    reference = copy.deepcopy(big.model)
    reference.encoder.layers = nn.ModuleList(reference.encoder.layers[i] for i in [0, 3])
    reference.decoder.layers = nn.ModuleList([reference.decoder.layers[0]])
    src = torch.tensor([[5, 9, 12, 7, 2], [8, 6, 11, 2, 0]])
    tgt = torch.tensor([[1, 14, 6, 9], [1, 7, 7, 13]])
    with torch.no_grad():
        want = reference(src, tgt).logits
        got = student.model(src, tgt).logits
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_a_stack_left_alone_is_the_teachers(teacher: Path, tmp_path: Path) -> None:
    student = shrink(teacher, tmp_path / "student", "--n-decoder-layers", "2")
    big = ckpt.load_checkpoint(teacher)
    assert student.model_config.n_encoder_layers == 4
    src = torch.tensor([[5, 9, 12, 7, 2]])
    with torch.no_grad():
        got, want = student.model.encode(src).memory, big.model.encode(src).memory
    torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize(
    ("args", "code", "named"),
    [
        (["--n-decoder-layers", "4"], 2, "--n-decoder-layers 4: "),
        (["--n-encoder-layers", "0"], 2, "--n-encoder-layers 0 must be at least 1"),
    ],
)
def test_a_count_the_teacher_cannot_give_is_refused_and_nothing_written(
    teacher: Path, tmp_path: Path, args: list[str], code: int, named: str
) -> None:
    before = files(tmp_path)
    result = runner.invoke(app, ["shrink", str(teacher), "--out", str(tmp_path / "s"), *args])
    assert result.exit_code == code, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and named in lines[0] and "Traceback" not in result.output
    assert files(tmp_path) == before and not (tmp_path / "s").exists()


@pytest.mark.slow
def test_the_student_fine_tunes_with_a_recipes_training_settings(
    teacher: Path, tmp_path: Path
) -> None:
    """`train --init-from` on the shrunk model takes its 1-layer decoder and the dates recipe's
    training settings (the recipe's own architecture is 2 + 2 layers of 128)."""
    student = tmp_path / "student"
    shrink(teacher, student, "--n-decoder-layers", "1")
    data = tmp_path / "pairs.tsv"
    data.write_text("source\ttarget\n" + "".join(f"{t}\t{t}\n" for t in TEXTS))
    out = tmp_path / "tuned"
    result = runner.invoke(
        app, ["train", "--init-from", str(student), "--recipe", "dates", "--data", str(data),
              "--out", str(out), "--max-steps", "2", "--save-every", "2", "--val-bleu", "0",
              "--no-cache", "--precision", "fp32"],  # fmt: skip
    )
    assert result.exit_code == 0, result.output
    tuned = ckpt.load_checkpoint(out)
    assert tuned.step == 2 and tuned.model_config.n_decoder_layers == 1
    assert tuned.model_config.d_model == 16 and tuned.train_config.max_tokens == 512
