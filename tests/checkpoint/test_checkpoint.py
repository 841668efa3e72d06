"""Checkpoint round trips (safetensors + JSON + tokenizer) and clear errors for bad folders."""

from __future__ import annotations

import errno
import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from tformer.checkpoint import (
    CONFIG,
    LATEST,
    MANIFEST,
    WEIGHTS,
    Tokenizers,
    load_checkpoint,
    load_training_state,
    resolve,
    save_checkpoint,
    verify_checkpoint,
)
from tformer.checkpoint.files import OPTIMIZER, TRAINER_STATE, write_manifest
from tformer.cli.commands import app
from tformer.config import ModelConfig, TrainConfig
from tformer.data.tokenizer import train_tokenizer
from tformer.errors import CheckpointError
from tformer.model import Transformer
from tformer.training.run import TrainResult


def test_run_folder_layout(trained: TrainResult) -> None:
    run = trained.run_dir
    latest = (run / LATEST).read_text().strip()
    assert latest == f"step-{trained.step:06d}"
    folder = run / latest
    names = {p.name for p in folder.iterdir()}
    assert {
        "model.safetensors",
        "config.json",
        "tokenizer.json",
        "optimizer.safetensors",
        "trainer_state.json",
    } <= names
    assert not [p for p in run.iterdir() if p.name.startswith(".")]  # no temporaries left
    config = json.loads((folder / CONFIG).read_text())
    assert config["format_version"] == 2
    assert config["model"]["d_model"] == 64 and config["train"]["max_steps"] == 600
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert any("val_loss" in r for r in records) and any("loss" in r for r in records)
    assert not list(run.rglob("*.pt")) and not list(run.rglob("*.bin"))  # no pickle files
    # best/ holds the checkpoint with the lowest validation loss, apart from --keep-last.
    best = resolve(run / "best")
    vals = {r["step"]: r["val_loss"] for r in records if "val_loss" in r}
    assert int(best.name.removeprefix("step-")) == min(vals, key=vals.get)
    assert json.loads((best / CONFIG).read_text())["metrics"]["val_loss"] == pytest.approx(
        min(vals.values()), abs=1e-5
    )


def _model_and_tokenizers(share: bool = True) -> tuple[Transformer, Tokenizers]:
    texts = ["the cat sat", "on the mat", "3 1 4 1 5"] * 20
    tok = train_tokenizer(texts, vocab_size=40)
    other = tok if share else train_tokenizer(texts + ["zz yy"] * 5, vocab_size=45)
    config = ModelConfig(
        src_vocab_size=tok.vocab_size,
        tgt_vocab_size=other.vocab_size,
        d_model=16,
        n_heads=2,
        n_encoder_layers=1,
        n_decoder_layers=1,
        d_ff=32,
        max_len=16,
        share_embeddings=share,
    )
    return Transformer(config).eval(), Tokenizers(tok, other)


@pytest.mark.parametrize("share", [True, False])
def test_round_trip_gives_identical_logits(tmp_path: Path, share: bool) -> None:
    model, toks = _model_and_tokenizers(share)
    folder = save_checkpoint(
        tmp_path / "run", model=model, train_config=TrainConfig(), tokenizers=toks, step=3
    )
    loaded = load_checkpoint(tmp_path / "run")
    assert loaded.path == folder and loaded.step == 3
    assert loaded.model_config == model.config
    assert loaded.tokenizers.shared == share
    src = torch.tensor([[4, 5, 6, 7]])
    tgt = torch.tensor([[1, 8, 9]])
    torch.testing.assert_close(
        loaded.model(src, tgt).logits, model(src, tgt).logits, rtol=0, atol=0
    )
    if share:  # tied weights stay tied after loading
        assert loaded.model.encoder.embedding is loaded.model.decoder.embedding


def test_keep_last_prunes_old_checkpoints(tmp_path: Path) -> None:
    model, toks = _model_and_tokenizers()
    for step in (1, 2, 3):
        save_checkpoint(
            tmp_path,
            model=model,
            train_config=TrainConfig(),
            tokenizers=toks,
            step=step,
            keep_last=2,
        )
    assert sorted(p.name for p in tmp_path.glob("step-*")) == ["step-000002", "step-000003"]
    assert resolve(tmp_path).name == "step-000003"


def test_errors_name_the_problem(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="no such checkpoint"):
        load_checkpoint(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="not a tformer checkpoint"):
        load_checkpoint(tmp_path / "empty")

    model, toks = _model_and_tokenizers()
    folder = save_checkpoint(
        tmp_path / "run", model=model, train_config=TrainConfig(), tokenizers=toks, step=1
    )
    broken = tmp_path / "broken"
    shutil.copytree(folder, broken)
    data = (broken / WEIGHTS).read_bytes()
    (broken / WEIGHTS).write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="model.safetensors.*truncated"):
        load_checkpoint(broken)

    partial = tmp_path / "partial"
    shutil.copytree(folder, partial)
    (partial / MANIFEST).unlink()
    with pytest.raises(CheckpointError, match="manifest.json: missing.*partial"):
        load_checkpoint(partial)


# -- the tokenizer is bound to the model -------------------------------------------------------


def _reseal(folder: Path) -> None:
    """Rewrite the manifest after tampering, to reach the checks behind it."""
    write_manifest(folder)


def test_another_tokenizer_is_refused(tmp_path: Path) -> None:
    model, toks = _model_and_tokenizers()
    folder = save_checkpoint(
        tmp_path / "run", model=model, train_config=TrainConfig(), tokenizers=toks, step=1
    )
    other = train_tokenizer(["completely different text here"] * 10, vocab_size=30)
    other.save(folder / "tokenizer.json")
    # Swapped after saving: the manifest notices first ...
    with pytest.raises(CheckpointError, match=r"tokenizer\.json: .*manifest\.json"):
        load_checkpoint(folder)
    # ... and with a consistent manifest, the hash recorded in config.json does.
    _reseal(folder)
    with pytest.raises(CheckpointError, match="does not match the tokenizer recorded in"):
        load_checkpoint(folder)


def test_a_vocabulary_that_does_not_fit_the_embeddings_is_refused(tmp_path: Path) -> None:
    model, toks = _model_and_tokenizers()
    folder = save_checkpoint(
        tmp_path / "run", model=model, train_config=TrainConfig(), tokenizers=toks, step=1
    )
    other = train_tokenizer(["3 1 4 1 5 9 2 6 zz yy xx ww"] * 10, vocab_size=30)
    assert other.vocab_size != toks.source.vocab_size
    other.save(folder / "tokenizer.json")
    config = json.loads((folder / CONFIG).read_text())
    config["tokenizer"]["sha256"] = {"source": other.sha256(), "target": other.sha256()}
    config["tokenizer"]["vocab_size"] = {"source": other.vocab_size, "target": other.vocab_size}
    (folder / CONFIG).write_text(json.dumps(config))
    _reseal(folder)
    with pytest.raises(CheckpointError) as error:
        load_checkpoint(folder)
    message = str(error.value)
    assert f"tokenizer.json has {other.vocab_size} tokens" in message
    assert "config.json" in message and "model.safetensors" in message

    config["tokenizer"]["special_token_ids"] = {"<pad>": 1, "<bos>": 0, "<eos>": 2, "<unk>": 3}
    (folder / CONFIG).write_text(json.dumps(config))
    _reseal(folder)
    with pytest.raises(CheckpointError, match="special token ids"):
        load_checkpoint(folder)


def test_config_records_the_tokenizer_identity(tmp_path: Path) -> None:
    model, toks = _model_and_tokenizers(share=False)
    folder = save_checkpoint(
        tmp_path / "run", model=model, train_config=TrainConfig(), tokenizers=toks, step=1
    )
    identity = json.loads((folder / CONFIG).read_text())["tokenizer"]
    assert identity["files"] == {
        "source": "source_tokenizer.json",
        "target": "target_tokenizer.json",
    }
    assert identity["sha256"]["target"] == toks.target.sha256()
    assert identity["vocab_size"] == {"source": toks.source.vocab_size,
                                      "target": toks.target.vocab_size}
    assert identity["special_token_ids"] == {"<pad>": 0, "<bos>": 1, "<eos>": 2, "<unk>": 3}


# -- atomic, self-checking checkpoints ---------------------------------------------------------


def _resumable(tmp_path: Path, step: int = 1) -> Path:
    """A checkpoint with an optimizer state and a trainer state, as training writes them."""
    model, toks = _model_and_tokenizers()
    optimizer = torch.optim.Adam(model.parameters())
    model.train()
    model(torch.tensor([[4, 5]]), torch.tensor([[1, 6]])).logits.sum().backward()
    optimizer.step()
    state = {"position": {"step": step, "epoch": 0, "batch": 1, "tokens": 2, "elapsed": 0.1}}
    return save_checkpoint(
        tmp_path / "run",
        model=model,
        train_config=TrainConfig(),
        tokenizers=toks,
        step=step,
        optimizer=optimizer,
        trainer_state=state,
        rng_state={"torch": torch.get_rng_state()},
    )


def _load_everything(folder: Path) -> None:
    """What a resume reads: the model, tokenizer, optimizer and trainer state."""
    loaded = load_checkpoint(folder)
    load_training_state(folder, torch.optim.Adam(loaded.model.parameters()))


def test_manifest_records_every_file(tmp_path: Path) -> None:
    folder = _resumable(tmp_path)
    manifest = json.loads((folder / MANIFEST).read_text())
    names = {p.name for p in folder.iterdir()} - {MANIFEST}
    assert set(manifest["files"]) == names
    for name, entry in manifest["files"].items():
        data = (folder / name).read_bytes()
        assert entry == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    _, checks = verify_checkpoint(folder)
    assert all(c.ok for c in checks), [c for c in checks if not c.ok]
    _load_everything(folder)


def _flip(path: Path, where: str) -> None:
    data = bytearray(path.read_bytes())
    if where == "truncate":
        path.write_bytes(bytes(data[: len(data) // 2]))
        return
    index = 9 if where == "flip-start" else len(data) // 2
    data[index] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("how", ["flip-start", "flip-middle", "truncate"])
@pytest.mark.parametrize(
    "name", [WEIGHTS, CONFIG, "tokenizer.json", OPTIMIZER, TRAINER_STATE, MANIFEST]
)
def test_corruption_is_caught_by_verify_and_load(tmp_path: Path, name: str, how: str) -> None:
    folder = _resumable(tmp_path)
    _flip(folder / name, how)
    _, checks = verify_checkpoint(folder)
    failed = [c for c in checks if not c.ok]
    assert failed, f"verify missed a corrupt {name}"
    assert name in failed[0].detail
    with pytest.raises(CheckpointError, match=name.replace(".", r"\.")):
        _load_everything(folder)
    result = CliRunner().invoke(app, ["verify", str(folder)])
    assert result.exit_code == 4
    assert name in result.stderr and "Traceback" not in result.output


def test_verify_command_passes_a_sound_run(tmp_path: Path) -> None:
    folder = _resumable(tmp_path)
    result = CliRunner().invoke(app, ["verify", str(folder.parent), "--all"])
    assert result.exit_code == 0, result.output
    for check in ("manifest.json", "file model.safetensors", "model.safetensors header",
                  "tokenizer", "training state", "weights load"):
        assert check in result.stdout
    missing = CliRunner().invoke(app, ["verify", str(tmp_path / "nope")])
    assert missing.exit_code == 4 and "no such checkpoint" in missing.stderr


def test_a_failed_save_names_the_path_and_keeps_the_previous_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = _resumable(tmp_path, step=1)
    run = first.parent

    def full_disk(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", str(run / "x"))

    monkeypatch.setattr("tformer.checkpoint.store.save_model", full_disk)
    model, toks = _model_and_tokenizers()
    with pytest.raises(CheckpointError, match="No space left on device") as error:
        save_checkpoint(run, model=model, train_config=TrainConfig(), tokenizers=toks, step=2)
    assert str(run) in str(error.value) and "--out" in str(error.value)
    assert resolve(run) == first
    assert sorted(p.name for p in run.iterdir()) == ["latest", "step-000001"]


def test_saving_a_step_again_replaces_it(tmp_path: Path) -> None:
    model, toks = _model_and_tokenizers()
    for _ in range(2):
        folder = save_checkpoint(
            tmp_path, model=model, train_config=TrainConfig(), tokenizers=toks, step=5
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step-000005"]
    load_checkpoint(folder)


def test_weights_that_do_not_match_the_model_name_the_tensors(tmp_path: Path) -> None:
    # torch's message starts with a bare "Error(s) in loading state_dict for ...:" line; the
    # refusal must go on to name what is missing, on one line.
    from safetensors.torch import save_file

    from tformer.checkpoint.store import load_weights
    from tformer.config import ModelConfig
    from tformer.model import Transformer

    config = ModelConfig(src_vocab_size=20, tgt_vocab_size=20, d_model=8, n_heads=2,
                         n_encoder_layers=1, n_decoder_layers=1, d_ff=16,
                         tie_embeddings=False, share_embeddings=False)
    state = {k: v.contiguous() for k, v in Transformer(config).state_dict().items()}
    del state["encoder.layers.0.norm1.weight"]
    path = tmp_path / "model.safetensors"
    save_file(state, str(path))
    with pytest.raises(CheckpointError) as error:
        load_weights(Transformer(config), path)
    message = str(error.value)
    assert "\n" not in message and "Missing key" in message and "norm1.weight" in message
