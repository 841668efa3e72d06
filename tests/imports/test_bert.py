"""tformer import of BERT: a real BertForMaskedLM (tiny config, random weights) with a WordPiece
tokenizer trained here on Multi30k and saved as BertTokenizerFast. The imported model must
compute transformers' function: logits, fill-mask's top 5 and token ids equal."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")

from tokenizers import Tokenizer as HFTokenizer  # noqa: E402
from tokenizers import decoders, models, normalizers, pre_tokenizers, trainers  # noqa: E402

from tests.imports.conftest import lines, tformer  # noqa: E402
from tests.imports.test_gpt2 import fine_tuned_losses  # noqa: E402
from tformer.analysis.language import fill_mask  # noqa: E402
from tformer.analysis.score_text import score_masked_text  # noqa: E402
from tformer.checkpoint.store import load_checkpoint  # noqa: E402
from tformer.config import EOS_ID  # noqa: E402
from tformer.data.hf_tokenizers import to_tformer_ids  # noqa: E402
from tformer.errors import CheckpointError, ConfigError, DataError  # noqa: E402
from tformer.imports import import_model  # noqa: E402
from tformer.imports.bert import bert_order  # noqa: E402

# In the trainer's order, so [UNK] and [CLS] are not where tformer puts them.
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


@dataclass
class BertCase:
    folder: Path
    model: Any  # BertForMaskedLM, eval mode
    tokenizer: Any  # BertTokenizerFast
    out: Path  # the imported checkpoint


def wordpiece(texts: list[str]) -> Any:
    """BERT's tokenizer shape: BertNormalizer (lower case), BertPreTokenizer, WordPiece."""
    inner = HFTokenizer(models.WordPiece(unk_token="[UNK]"))
    inner.normalizer = normalizers.BertNormalizer(lowercase=True)
    inner.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    inner.decoder = decoders.WordPiece()
    trainer = trainers.WordPieceTrainer(
        vocab_size=500, special_tokens=SPECIALS, show_progress=False
    )
    inner.train_from_iterator(texts, trainer)
    return transformers.BertTokenizerFast(tokenizer_object=inner)


@pytest.fixture(scope="module")
def bert(toy_data: Path, tmp_path_factory: pytest.TempPathFactory) -> BertCase:
    root = tmp_path_factory.mktemp("bert")
    tokenizer = wordpiece(lines("train", "en", 3000, toy_data))
    config = transformers.BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(1)
    model = transformers.BertForMaskedLM(config).eval()
    torch.manual_seed(1)  # the weights below depend on this seed alone, not on transformers' init
    with torch.no_grad():  # far from the initial values, so every tensor must map
        for name, p in model.named_parameters():
            p.normal_(std=0.3 if p.dim() == 2 else 0.2)
            if "LayerNorm" in name and name.endswith("weight"):
                p.add_(1.0)
    folder = root / "saved"
    model.save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    out = import_model(folder, root / "imported")
    return BertCase(folder, model, tokenizer, out)


def mapping(case: BertCase) -> dict[int, int]:
    return to_tformer_ids(bert_order(case.tokenizer, len(case.tokenizer), case.folder))


def test_ids_equal_transformers_on_every_test_line(bert: BertCase, toy_data: Path) -> None:
    ckpt = load_checkpoint(bert.out)
    texts = lines("test2016", "en", 10_000, toy_data)
    ours = ckpt.tokenizers.source.encode_batch(texts)
    theirs = bert.tokenizer(texts, add_special_tokens=False)["input_ids"]
    to_ours = mapping(bert)
    assert len(texts) >= 100
    for text, mine, hf in zip(texts, ours, theirs, strict=True):
        assert mine == [to_ours[i] for i in hf], text
        theirs_text = bert.tokenizer.decode(hf, skip_special_tokens=True)
        assert ckpt.tokenizers.source.decode(mine) == theirs_text


def test_logits_equal_transformers(bert: BertCase, toy_data: Path) -> None:
    """tformer reads text <eos> with <bos> put before it by the model: [CLS] text [SEP]."""
    ckpt = load_checkpoint(bert.out)
    to_ours = mapping(bert)
    order = torch.tensor(bert_order(bert.tokenizer, len(bert.tokenizer), bert.folder))
    for text in lines("val", "en", 20, toy_data):
        hf = bert.tokenizer(text, truncation=True, max_length=64, return_tensors="pt")
        ids = [to_ours[i] for i in hf["input_ids"][0, 1:-1].tolist()] + [EOS_ID]
        with torch.no_grad():
            theirs = bert.model(**hf).logits[0, 1:]  # [CLS]'s row left out, as tformer does
            ours = ckpt.model(torch.tensor([ids])).logits[0]
        torch.testing.assert_close(ours, theirs[:, order], atol=1e-4, rtol=1e-4)


def test_fill_mask_top5_equal_transformers(bert: BertCase, toy_data: Path) -> None:
    ckpt = load_checkpoint(bert.out)
    checked = 0
    for line in lines("val", "en", 12, toy_data):
        words = line.split()
        if len(words) < 4:
            continue
        words[2] = "<mask>"
        ours = fill_mask(ckpt, " ".join(words), top_k=5)
        hf = bert.tokenizer(" ".join(words).replace("<mask>", "[MASK]"), return_tensors="pt")
        at = hf["input_ids"][0].tolist().index(bert.tokenizer.mask_token_id)
        with torch.no_grad():
            probs = bert.model(**hf).logits[0, at].softmax(-1)
        top = probs.topk(5)
        # shown as transformers names them ([MASK], not <mask>)
        assert [f.token for f in ours[0].fillers] == bert.tokenizer.convert_ids_to_tokens(
            top.indices.tolist()
        )
        assert [f.probability for f in ours[0].fillers] == pytest.approx(
            top.values.tolist(), abs=1e-5
        )
        checked += 1
    assert checked >= 5


def test_score_is_the_pseudo_log_likelihood_transformers_gives(
    bert: BertCase, toy_data: Path
) -> None:
    """tformer score on BERT: each word piece masked alone in [CLS] text [SEP], its log
    probability from BertForMaskedLM, the same tokens' loss, rank and top choice."""
    ckpt = load_checkpoint(bert.out)
    to_ours = mapping(bert)
    for text in lines("val", "en", 6, toy_data):
        scored = score_masked_text(ckpt.model, ckpt.tokenizers, text)
        hf = bert.tokenizer(text, return_tensors="pt")["input_ids"][0]
        copies = hf.repeat(len(hf) - 2, 1)
        positions = torch.arange(1, len(hf) - 1)
        copies[positions - 1, positions] = bert.tokenizer.mask_token_id
        with torch.no_grad():
            logits = bert.model(input_ids=copies).logits[positions - 1, positions]
        logp = logits.log_softmax(-1)
        theirs = -logp[torch.arange(len(positions)), hf[1:-1]]
        assert scored.label_ids == [to_ours[i] for i in hf[1:-1].tolist()]
        torch.testing.assert_close(torch.tensor(scored.loss), theirs, atol=1e-4, rtol=1e-4)
        assert scored.top_ids == [to_ours[i] for i in logits.argmax(-1).tolist()]
        assert scored.perplexity == pytest.approx(math.exp(float(theirs.mean())), rel=1e-4)


def test_score_reads_up_to_max_len_tokens_after_cls(bert: BertCase) -> None:
    # [CLS] has a position of its own: max_len counts the text and its [SEP].
    ckpt = load_checkpoint(bert.out)
    limit = ckpt.model_config.max_len
    assert ckpt.tokenizers.source.encode("a " * 3) == ckpt.tokenizers.source.encode("a") * 3
    fits = score_masked_text(ckpt.model, ckpt.tokenizers, "a " * (limit - 1))
    assert fits.tokens == limit - 1
    with pytest.raises(DataError, match=f"{limit + 1} tokens as the model reads it"):
        score_masked_text(ckpt.model, ckpt.tokenizers, "a " * limit)


def test_fill_mask_with_int8_layers_stays_close_to_float(
    bert: BertCase, toy_data: Path
) -> None:
    from tformer.fast.int8 import quantize_int8

    text = "a man in a <mask> shirt is <mask> ."
    exact = fill_mask(load_checkpoint(bert.out), text, top_k=5)
    ckpt = load_checkpoint(bert.out)
    quantize_int8(ckpt.model)
    assert any("Int8" in type(m).__name__ for m in ckpt.model.modules())
    int8 = fill_mask(ckpt, text, top_k=5)
    for ours, theirs in zip(int8, exact, strict=True):
        assert ours.fillers[0].token == theirs.fillers[0].token
        assert [f.probability for f in ours.fillers] != [f.probability for f in theirs.fillers]
        assert ours.fillers[0].probability == pytest.approx(theirs.fillers[0].probability,
                                                            abs=0.05)  # fmt: skip


@pytest.mark.slow
def test_cli_import_and_fill_mask(bert: BertCase, tmp_path: Path) -> None:
    out = tmp_path / "cli"
    run = tformer("import", bert.folder, out)
    assert run.exit_code == 0, run.output
    config = json.loads((out / "config.json").read_text())["model"]
    assert config["arch"] == "encoder-only" and config["bos_first"] and config["mlm_head"]
    filled = tformer("fill-mask", out, "a man in a <mask> shirt")
    assert filled.exit_code == 0, filled.output
    assert "<mask>" in filled.stdout


def test_unsupported_model_type_refused_in_one_line(bert: BertCase, tmp_path: Path) -> None:
    folder = tmp_path / "t5"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "roberta"}))
    with pytest.raises(CheckpointError, match="model_type 'roberta' is not supported") as error:
        import_model(folder, tmp_path / "out")
    assert "\n" not in str(error.value) and "bert" in str(error.value)


def test_relative_positions_refused_in_one_line(bert: BertCase, tmp_path: Path) -> None:
    folder = tmp_path / "relative"
    folder.mkdir()
    config = json.loads((bert.folder / "config.json").read_text())
    config["position_embedding_type"] = "relative_key"
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="position_embedding_type 'relative_key'"):
        import_model(folder, tmp_path / "out")


def test_train_init_from_fine_tunes_the_import(
    bert: BertCase, toy_data: Path, tmp_path: Path
) -> None:
    before, after = fine_tuned_losses(bert.out, toy_data, tmp_path)
    assert after < before - 0.1, (before, after)


def test_fill_mask_refuses_a_tokenizer_without_mask_in_one_line(
    bert: BertCase, tmp_path: Path
) -> None:
    """A checkpoint whose tokenizer lost its <mask> (here: renamed) is refused, not guessed."""
    ckpt = load_checkpoint(bert.out)
    data = json.loads(ckpt.tokenizers.source.to_str())
    vocab = data["model"]["vocab"]
    vocab["<nomask>"] = vocab.pop("<mask>")
    data["added_tokens"] = [t for t in data["added_tokens"] if t["content"] != "<mask>"]
    ckpt.tokenizers.source.inner = HFTokenizer.from_str(json.dumps(data))
    with pytest.raises(ConfigError, match="has no <mask> token at id 4") as error:
        fill_mask(ckpt, "a man in a <mask> shirt")
    assert "\n" not in str(error.value)


def test_fill_mask_takes_berts_own_mask_token(bert: BertCase) -> None:
    """[MASK], as BERT's users write it, is the mask as <mask> is: the same fillers."""
    ours = tformer("fill-mask", bert.out, "a man in a <mask> shirt", "--json")
    theirs = tformer("fill-mask", bert.out, "a man in a [MASK] shirt", "--json")
    assert ours.exit_code == 0 and theirs.exit_code == 0, theirs.output
    assert json.loads(ours.stdout)["masks"] == json.loads(theirs.stdout)["masks"]
    table = tformer("fill-mask", bert.out, "a [MASK] in a <mask> shirt")
    assert table.stdout.count("probability") == 2  # one table for each mask
    none = tformer("fill-mask", bert.out, "a man in a shirt")
    assert none.exit_code != 0
    assert "the input has no <mask> or [MASK]: write [MASK] where" in none.stderr


def test_maps_show_berts_own_special_tokens(bert: BertCase, tmp_path: Path) -> None:
    """tformer's <bos> <eos> <mask> are shown as [CLS] [SEP] [MASK], from config.json's record
    of the tokenizer's own names."""
    saved = tmp_path / "map.json"
    result = tformer("inspect-attention", bert.out, "a man in a [MASK] shirt", "--save", saved)
    assert result.exit_code == 0, result.output
    columns = json.loads(saved.read_text())["columns"]
    assert columns == ["[CLS]", "a", "man", "in", "a", "[MASK]", "shirt", "[SEP]"]
    assert "[CLS]" in result.stdout and "<bos>" not in result.stdout
    identity = json.loads((bert.out / "config.json").read_text())["tokenizer"]
    names = {"<pad>": "[PAD]", "<bos>": "[CLS]", "<eos>": "[SEP]", "<unk>": "[UNK]",
             "<mask>": "[MASK]"}  # fmt: skip
    assert identity["special_names"] == {"source": names, "target": names}


def test_a_broken_record_of_special_names_is_refused(bert: BertCase) -> None:
    from tformer.checkpoint.tokenizers import load_tokenizers

    config = json.loads((bert.out / "config.json").read_text())
    config["tokenizer"]["special_names"]["source"]["<bos>"] = "\x1b[31m"
    with pytest.raises(CheckpointError, match="names \\(1 to 64 printable characters\\)"):
        load_tokenizers(bert.out, config)
