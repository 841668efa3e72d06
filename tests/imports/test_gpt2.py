"""tformer import of GPT-2: a real GPT2LMHeadModel (tiny config, random weights) with a byte-level
BPE trained here on Multi30k and saved as GPT2TokenizerFast. The imported model must compute
transformers' function: logits, greedy continuations and token ids equal."""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

transformers = pytest.importorskip("transformers")

from tokenizers import Tokenizer as HFTokenizer  # noqa: E402
from tokenizers import decoders, models, pre_tokenizers, trainers  # noqa: E402

from tests.conftest import refusal_lines  # noqa: E402
from tests.imports.conftest import lines, tformer  # noqa: E402
from tformer.analysis.language import evaluate_language  # noqa: E402
from tformer.checkpoint.store import load_checkpoint  # noqa: E402
from tformer.cli.commands import app  # noqa: E402
from tformer.config import BOS_ID, EOS_ID  # noqa: E402
from tformer.data.display import display_tokens  # noqa: E402
from tformer.data.hf_tokenizers import to_tformer_ids  # noqa: E402
from tformer.decoding.api import decode_texts  # noqa: E402
from tformer.decoding.settings import DecodingConfig  # noqa: E402
from tformer.errors import CheckpointError  # noqa: E402
from tformer.imports import import_model  # noqa: E402
from tformer.imports.check import compared_rows  # noqa: E402
from tformer.imports.gpt2 import gpt2_order  # noqa: E402

EOT = "<|endoftext|>"


@dataclass
class GPT2Case:
    folder: Path
    model: Any  # GPT2LMHeadModel, eval mode
    tokenizer: Any  # GPT2TokenizerFast
    out: Path  # the imported checkpoint


def byte_level_bpe(texts: list[str]) -> Any:
    """GPT-2's tokenizer shape: byte-level pre-tokenisation, BPE, <|endoftext|> as the last id
    (as in GPT-2's own vocabulary, so the import's reordering is exercised)."""
    inner = HFTokenizer(models.BPE())
    inner.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    inner.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    inner.train_from_iterator(texts, trainer)
    inner.add_special_tokens([EOT])
    return transformers.GPT2TokenizerFast(
        tokenizer_object=inner, bos_token=EOT, eos_token=EOT, unk_token=EOT
    )


@pytest.fixture(scope="module")
def gpt2(toy_data: Path, tmp_path_factory: pytest.TempPathFactory) -> GPT2Case:
    root = tmp_path_factory.mktemp("gpt2")
    tokenizer = byte_level_bpe(lines("train", "en", 3000, toy_data))
    config = transformers.GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=48,
        n_embd=32,
        n_layer=2,
        n_head=4,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        layer_norm_epsilon=1e-5,
    )
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config).eval()
    with torch.no_grad():  # far from the initial values, so every tensor must map
        for name, p in model.named_parameters():
            p.normal_(std=0.3 if p.dim() == 2 else 0.2)
            if ".ln_" in name and name.endswith("weight"):
                p.add_(1.0)
    folder = root / "saved"
    model.save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    out = import_model(folder, root / "imported")
    return GPT2Case(folder, model, tokenizer, out)


def tformer_ids(case: GPT2Case, hf_ids: list[int]) -> list[int]:
    order = gpt2_order(len(case.tokenizer), case.tokenizer.eos_token_id)
    mapping = to_tformer_ids(order)
    return [mapping[i] for i in hf_ids]


def test_ids_equal_transformers_on_every_test_line(gpt2: GPT2Case, toy_data: Path) -> None:
    ckpt = load_checkpoint(gpt2.out)
    texts = lines("test2016", "en", 10_000, toy_data)
    ours = ckpt.tokenizers.source.encode_batch(texts)
    theirs = gpt2.tokenizer(texts, add_special_tokens=False)["input_ids"]
    assert len(texts) >= 100
    for text, mine, hf in zip(texts, ours, theirs, strict=True):
        assert mine == tformer_ids(gpt2, hf), text
        assert ckpt.tokenizers.source.decode(mine) == gpt2.tokenizer.decode(hf)


def test_logits_equal_transformers(gpt2: GPT2Case, toy_data: Path) -> None:
    """tformer reads <bos> (= <|endoftext|>) then the text; GPT-2 the same ids."""
    ckpt = load_checkpoint(gpt2.out)
    model = ckpt.model.eval()
    eot = gpt2.tokenizer.eos_token_id
    # <eos> and every other piece (tformer's rows 2, 4...) against their GPT-2 ids; the
    # rows GPT-2 has not (<pad>, <unk>, <bos> a copy of <eos>) are never predicted.
    rows, columns = compared_rows(gpt2_order(len(gpt2.tokenizer), eot), model.logits_bias)
    assert rows == [2, *range(4, len(gpt2.tokenizer) + 3)]
    for text in lines("val", "en", 20, toy_data):
        hf = [eot, *gpt2.tokenizer.encode(text)][:48]
        ids = [BOS_ID, *tformer_ids(gpt2, hf[1:])]
        with torch.no_grad():
            theirs = gpt2.model(torch.tensor([hf])).logits[0]
            ours = model(torch.zeros(1, 0, dtype=torch.long), torch.tensor([ids])).logits[0]
        torch.testing.assert_close(ours[:, rows], theirs[:, columns], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(
            ours.log_softmax(-1)[:, rows],
            theirs.log_softmax(-1)[:, columns],
            atol=1e-4,
            rtol=1e-4,
        )
        assert ours.softmax(-1)[:, [0, 1, 3]].max() < 1e-6


def test_greedy_equals_transformers_generate(gpt2: GPT2Case, toy_data: Path) -> None:
    ckpt = load_checkpoint(gpt2.out)
    eot = gpt2.tokenizer.eos_token_id
    prompts = [" ".join(line.split()[:4]) for line in lines("val", "en", 8, toy_data)]
    ids = [tformer_ids(gpt2, gpt2.tokenizer.encode(p)) for p in prompts]
    hyps = decode_texts(ckpt.model, ids, DecodingConfig(max_new_tokens=48))
    mapping = to_tformer_ids(gpt2_order(len(gpt2.tokenizer), eot))
    for prompt, found in zip(prompts, hyps, strict=True):
        hf_in = torch.tensor([[eot, *gpt2.tokenizer.encode(prompt)]])
        room = 48 - hf_in.size(1)
        out = gpt2.model.generate(
            hf_in, do_sample=False, max_new_tokens=room, eos_token_id=eot, pad_token_id=eot
        )[0, hf_in.size(1) :].tolist()
        if eot in out:
            out = out[: out.index(eot)]
        expected = [mapping[i] for i in out]
        n = min(len(found[0].ids), len(expected))
        assert n > 0
        assert found[0].ids[:n] == expected[:n], prompt


@pytest.mark.slow
def test_cli_import_and_generate(gpt2: GPT2Case, tmp_path: Path) -> None:
    out = tmp_path / "cli"
    run = tformer("import", gpt2.folder, out)
    assert run.exit_code == 0, run.output
    generated = tformer("generate", out, "A man in a blue shirt")
    assert generated.exit_code == 0, generated.output
    assert generated.stdout.strip()


def test_unsupported_setting_refused_in_one_line(gpt2: GPT2Case, tmp_path: Path) -> None:
    folder = tmp_path / "odd"
    gpt2.model.config.scale_attn_by_inverse_layer_idx = True
    try:
        gpt2.model.save_pretrained(str(folder))
    finally:
        gpt2.model.config.scale_attn_by_inverse_layer_idx = False
    gpt2.tokenizer.save_pretrained(str(folder))
    with pytest.raises(CheckpointError, match="scale_attn_by_inverse_layer_idx") as error:
        import_model(folder, tmp_path / "out")
    assert "\n" not in str(error.value)


def test_perplexity_equals_transformers_on_the_joined_text(
    gpt2: GPT2Case, toy_data: Path
) -> None:
    """evaluate joins documents as GPT-2 read them, <|endoftext|> between them (no <bos> per
    document), cut into blocks of its 48 positions: the same loss as GPT-2's on that stream."""
    docs = lines("val", "en", 30, toy_data)
    ckpt = load_checkpoint(gpt2.out)
    assert not ckpt.model_config.document_bos
    measured = evaluate_language(ckpt, docs)
    eot = gpt2.tokenizer.eos_token_id
    stream = [eot]
    for doc in docs:
        stream += [*gpt2.tokenizer.encode(doc), eot]
    total, count = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(stream) - 1, 48):
            block = torch.tensor([stream[start : start + 49]])
            logits = gpt2.model(block[:, :-1]).logits
            loss = torch.nn.functional.cross_entropy(logits[0], block[0, 1:], reduction="sum")
            total += float(loss)
            count += block.size(1) - 1
    assert measured.tokens == count
    assert measured.loss == pytest.approx(total / count, rel=1e-4)


def fine_tuned_losses(imported: Path, toy_data: Path, tmp_path: Path) -> tuple[float, float]:
    """An imported language model's loss on 64 Multi30k lines before and after 12 steps of
    ``train --init-from`` on them."""
    data = tmp_path / "text"
    data.mkdir()
    docs = lines("train", "en", 64, toy_data)
    (data / "train.txt").write_text("\n".join(docs) + "\n", encoding="utf-8")
    (data / "validation.txt").write_text("\n".join(docs[:8]) + "\n", encoding="utf-8")
    out = tmp_path / "tuned"
    result = CliRunner().invoke(
        app, ["train", "--init-from", str(imported), "--data", str(data), "--out", str(out),
              "--max-steps", "12", "--lr", "3e-3", "--warmup-steps", "1", "--schedule",
              "constant", "--label-smoothing", "0", "--max-tokens", "512",
              "--log-every", "4", "--eval-every", "100", "--device", "cpu"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    start, tuned = load_checkpoint(imported), load_checkpoint(out)
    # the tokenizer's own names of the special tokens, for display, are kept by the fine-tune
    names = start.tokenizers.source.special_names
    assert names and tuned.tokenizers.source.special_names == names
    before = evaluate_language(start, docs).loss
    return before, evaluate_language(tuned, docs).loss


def test_train_init_from_fine_tunes_the_import(
    gpt2: GPT2Case, toy_data: Path, tmp_path: Path
) -> None:
    before, after = fine_tuned_losses(gpt2.out, toy_data, tmp_path)
    assert after < before - 0.1, (before, after)


def test_the_slow_files_vocab_and_merges_give_the_same_tokenizer(
    gpt2: GPT2Case, tmp_path: Path, toy_data: Path
) -> None:
    """GPT-2's own folders hold vocab.json + merges.txt (and tokenizer.json): the two read
    alike."""
    folder = tmp_path / "slow"
    shutil.copytree(gpt2.folder, folder)
    data = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    (folder / "tokenizer.json").unlink()
    (folder / "vocab.json").write_text(json.dumps(data["model"]["vocab"]), encoding="utf-8")
    merges = [m if isinstance(m, str) else " ".join(m) for m in data["model"]["merges"]]
    (folder / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n")
    slow = load_checkpoint(import_model(folder, tmp_path / "out")).tokenizers.source
    fast = load_checkpoint(gpt2.out).tokenizers.source
    texts = lines("test2016", "en", 200, toy_data)
    assert slow.encode_batch(texts) == fast.encode_batch(texts)


def test_score_gives_each_tokens_loss_as_transformers(gpt2: GPT2Case, toy_data: Path) -> None:
    """`tformer score CKPT TEXT` on a language model: <|endoftext|> (tformer's <bos>) then the
    text, each next token's loss equal to -log softmax of GPT-2's own logits."""
    text = lines("test2016", "en", 1, toy_data)[0]
    result = CliRunner().invoke(app, ["score", str(gpt2.out), text, "--json"])
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)
    hf_ids = gpt2.tokenizer(text, add_special_tokens=False)["input_ids"]
    eot = gpt2.tokenizer.eos_token_id
    with torch.no_grad():
        logp = gpt2.model(torch.tensor([[eot, *hf_ids]])).logits[0].log_softmax(-1)
    want = [-float(logp[i, label]) for i, label in enumerate([*hf_ids, eot])]
    got = [p["loss"] for p in record["positions"]]
    labels = [p["label_id"] for p in record["positions"]]
    assert labels == [*tformer_ids(gpt2, hf_ids), EOS_ID]  # <|endoftext|> closes it as <eos>
    assert got == pytest.approx(want, abs=1e-4)
    assert record["source"] == "" and record["reference"] == text


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["a man", "a dog"], "a language model scores one TEXT"),
        (["--split", "test"], "measured by tformer evaluate"),
        ([""], "TEXT: empty"),
        (["a " * 60], "the model reads 1 to 47 tokens"),
    ],
    ids=["reference", "split", "empty", "too-long"],
)
def test_score_refuses_what_a_language_model_cannot_score(
    gpt2: GPT2Case, args: list[str], message: str
) -> None:
    result = CliRunner().invoke(app, ["score", str(gpt2.out), *args])
    assert result.exit_code != 0
    lines_out = refusal_lines(result.stderr)
    assert len(lines_out) == 1 and message in lines_out[0], result.stderr


def test_ablate_ranks_gpt2s_heads_by_the_loss_evaluate_measures(
    gpt2: GPT2Case, tmp_path: Path
) -> None:
    """`tformer ablate` on a language model: each head's masked loss is what `tformer evaluate
    --mask-heads` measures of that head on the same documents; --metric bleu is refused."""
    runner = CliRunner()
    from tformer.data.lm import bundled_text_dir

    # an import records no training data: the split is read from --data (the demo text)
    split = ["--data", str(bundled_text_dir()), "--split", "validation", "--limit", "6"]
    result = runner.invoke(app, ["ablate", str(gpt2.out), *split, "--json"])
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)
    assert record["documents"] == 6 and len(record["heads"]) == 2 * 4  # layers x heads
    assert {h["part"] for h in record["heads"]} == {"dec"}

    def evaluated(*extra: str) -> float:
        out = tmp_path / f"eval{len(list(tmp_path.iterdir()))}"
        done = runner.invoke(app, ["evaluate", str(gpt2.out), *split, "--out", str(out), *extra])
        assert done.exit_code == 0, done.output
        return float(json.loads((out / "result.json").read_text())["metrics"]["loss"])

    assert record["baseline"]["loss"] == pytest.approx(evaluated(), abs=1e-4)
    top = record["heads"][0]
    assert top["quality"]["loss"] == pytest.approx(
        evaluated("--mask-heads", top["head"]), abs=1e-4
    )
    refused = runner.invoke(app, ["ablate", str(gpt2.out), "--metric", "bleu"])
    assert refused.exit_code != 0
    assert "is ablated by its loss" in " ".join(refused.stderr.split())


def test_inspect_attention_max_new_tokens_bounds_the_continuation(
    gpt2: GPT2Case, tmp_path: Path
) -> None:
    """--max-new-tokens, as generate's: the map holds <|endoftext|>, the prompt and at most
    that many generated tokens (without it the random model runs on to max_len)."""
    prompt = "A man in a blue shirt"
    saved = tmp_path / "map.json"
    result = tformer("inspect-attention", gpt2.out, prompt, "--max-new-tokens", "3",
                     "--save", saved)  # fmt: skip
    assert result.exit_code == 0, result.output
    record = json.loads(saved.read_text())
    prompt_ids = gpt2.tokenizer(prompt, add_special_tokens=False)["input_ids"]
    assert len(record["columns"]) == 1 + len(prompt_ids) + 3
    assert record["columns"][0] == EOT  # tformer's <bos>, shown by GPT-2's own name
    assert "columns 0-" not in result.stdout  # no longer folded into blocks
    refused = tformer("inspect-attention", gpt2.out, prompt, "--max-new-tokens", "0")
    assert refused.exit_code != 0 and "--max-new-tokens 0 must be >= 1" in refused.stderr


def test_tokens_are_shown_as_the_text_they_stand_for(gpt2: GPT2Case, toy_data: Path) -> None:
    """Byte-level pieces are shown as their text, a space as ▁ ("Ġman" is "▁man"), a byte of a
    character split across pieces as <0x..>; tformer's <bos>/<eos> as <|endoftext|>."""
    tokenizer = load_checkpoint(gpt2.out).tokenizers.source
    for text in filter(str.isascii, lines("test2016", "en", 20, toy_data)):
        hf_ids = gpt2.tokenizer(text, add_special_tokens=False)["input_ids"]
        pieces = gpt2.tokenizer.convert_ids_to_tokens(hf_ids)
        shown = display_tokens(tokenizer, tformer_ids(gpt2, hf_ids))
        assert shown == [p.replace("Ġ", "▁") for p in pieces], text
    shown = display_tokens(tokenizer, [BOS_ID, *tokenizer.encode("café ☕\n"), EOS_ID])
    assert shown[0] == shown[-1] == EOT
    assert "<0xE2>" in shown  # ☕'s first byte: a piece of its own
    assert spelled(shown[1:-1]) == "café ☕\n"


def spelled(shown: list[str]) -> str:
    """The text shown tokens spell: ▁ a space, \\n a line break, <0xNN> a byte."""
    data = b""
    for part in re.split(r"(<0x[0-9A-F]{2}>)", "".join(shown)):
        if re.fullmatch(r"<0x[0-9A-F]{2}>", part):
            data += bytes([int(part[3:5], 16)])
        else:
            data += part.replace("▁", " ").replace("\\n", "\n").encode()
    return data.decode()


def test_score_of_an_import_shows_its_own_tokens_and_smoothing(gpt2: GPT2Case) -> None:
    """The table and the JSON show GPT-2's pieces as text and <|endoftext|> by its name; the
    smoothed loss is named for what it is to a model tformer never trained."""
    result = tformer("score", gpt2.out, "A man in a blue shirt")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "▁man" in out and "Ġ" not in out
    assert "<bos>" not in out and "<eos>" not in out  # <|endoftext|>, cut to the width
    assert "the training loss" not in out
    caption = " ".join(out.split())
    assert "ε=0.1 (what tformer train --init-from fine-tunes this import with by default)" in (
        caption
    )
    record = json.loads(tformer("score", gpt2.out, "A man", "--json").stdout)
    positions = record["positions"]
    assert [p["input"] for p in positions] == [EOT, "A", "▁man"]
    assert [p["label"] for p in positions] == ["A", "▁man", EOT]
