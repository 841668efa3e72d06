"""tformer import of T5 (v1.0, and v1.1 with its gated GELU and untied output): a real
T5ForConditionalGeneration (tiny config, random weights) with a SentencePiece unigram model
trained here on Multi30k, its sentinels appended as T5's are, saved as T5Tokenizer. The imported
model must compute transformers' function: token ids, logits, greedy and beam-4 outputs equal."""

from __future__ import annotations

import json
import re
import shutil
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")
spm = pytest.importorskip("sentencepiece")

from tests.imports.conftest import lines, tformer  # noqa: E402
from tformer.checkpoint.store import Checkpoint, load_checkpoint  # noqa: E402
from tformer.config import BOS_ID, PAD_ID  # noqa: E402
from tformer.data.hf_tokenizers import to_tformer_ids  # noqa: E402
from tformer.decoding.api import decode_texts  # noqa: E402
from tformer.decoding.settings import DecodingConfig  # noqa: E402
from tformer.errors import CheckpointError  # noqa: E402
from tformer.imports import import_model  # noqa: E402
from tformer.imports.t5 import t5_order  # noqa: E402

SENTINELS = 8
PREFIX = "translate English to German: "
INPUTS = 24
MAX_NEW = 10


@dataclass
class T5Case:
    folder: Path
    model: Any  # T5ForConditionalGeneration, eval mode
    tokenizer: Any  # T5Tokenizer
    ckpt: Checkpoint


def t5_tokenizer(out: Path, toy_data: Path) -> Any:
    """A unigram SentencePiece model with T5's specials (pad 0, eos 1, unk 2, no bos), as
    transformers converts T5's spiece.model, with <extra_id_N> appended (N = 0 last)."""
    from transformers import T5Tokenizer
    from transformers.convert_slow_tokenizer import T5Converter

    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines("train", "en", 3000, toy_data)),
        model_prefix=str(out / "spiece"),
        vocab_size=300,
        model_type="unigram",
        pad_id=0,
        eos_id=1,
        unk_id=2,
        bos_id=-1,
        num_threads=1,
        minloglevel=2,
    )
    slow = types.SimpleNamespace(  # what T5Converter reads of the slow tokenizer
        vocab_file=str(out / "spiece.model"),
        legacy=True,
        add_prefix_space=True,
        _extra_ids=SENTINELS,  # appended by the converter, <extra_id_0> last
        convert_tokens_to_ids=lambda token: 1,  # </s>, for the post-processor
    )
    sentinels = [f"<extra_id_{i}>" for i in range(SENTINELS)]
    return T5Tokenizer(
        tokenizer_object=T5Converter(slow).converted(),
        extra_ids=0,
        additional_special_tokens=sentinels,
    )


VERSIONS = {  # T5Config settings of each version (the rest is common)
    "v1.0": dict(feed_forward_proj="relu", tie_word_embeddings=True),
    "v1.1": dict(feed_forward_proj="gated-gelu", tie_word_embeddings=False),
}


@pytest.fixture(scope="module", params=list(VERSIONS))
def t5(
    request: pytest.FixtureRequest, toy_data: Path, tmp_path_factory: pytest.TempPathFactory
) -> T5Case:
    from transformers import T5Config, T5ForConditionalGeneration

    folder = tmp_path_factory.mktemp("t5")
    tokenizer = t5_tokenizer(folder, toy_data)
    config = T5Config(
        vocab_size=len(tokenizer), d_model=32, d_kv=8, num_heads=4, d_ff=64, num_layers=2,
        num_decoder_layers=2, relative_attention_num_buckets=8,
        relative_attention_max_distance=20, dropout_rate=0.0, decoder_start_token_id=0,
        pad_token_id=0, eos_token_id=1, **VERSIONS[request.param],
    )  # fmt: skip
    torch.manual_seed(0)
    model = T5ForConditionalGeneration(config).eval()
    with torch.no_grad():  # biases big enough to decide outputs, so positions are tested
        for name, parameter in model.named_parameters():
            if "relative_attention_bias" in name:
                parameter.normal_(std=1.0)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    out = import_model(folder, tmp_path_factory.mktemp("imported") / "t5")
    return T5Case(folder, model, tokenizer, load_checkpoint(out))


def sources(toy_data: Path) -> list[str]:
    return [PREFIX + t for t in lines("test2016", "en", INPUTS, toy_data)]


def test_config_is_t5s(t5: T5Case) -> None:
    config = t5.ckpt.model_config
    assert config.positions == "relative" and config.relative_buckets == 8
    assert config.relative_max_distance == 20
    assert not config.attention_scale and not config.linear_bias
    assert not config.embedding_scale and config.source_eos
    assert (config.norm, config.normalization, config.norm_eps) == ("pre", "rmsnorm", 1e-6)
    v1_1 = t5.model.config.feed_forward_proj == "gated-gelu"
    assert config.activation == ("geglu_tanh" if v1_1 else "relu")
    assert config.ffn_hidden == t5.model.config.d_ff == 64
    # v1.0 rescales the output by d_model^-0.5, v1.1 does not; transformers 5 ties both.
    assert config.tie_embeddings and config.output_scale == (not v1_1)


def test_ids_equal_the_t5_tokenizer(t5: T5Case, toy_data: Path) -> None:
    order = t5_order(len(t5.tokenizer))
    texts = lines("test2016", "en", 1000, toy_data)
    texts += ["A dog <extra_id_0> the park <extra_id_7>.", PREFIX + texts[0]]
    ours = t5.ckpt.tokenizers.source.encode_batch(texts)
    theirs = t5.tokenizer(texts).input_ids
    for mine, hf in zip(ours, theirs, strict=True):
        assert [order[i] for i in mine] + [1] == hf  # T5Tokenizer appends </s>
    sentinel = t5.ckpt.tokenizers.source.encode("<extra_id_0>")
    assert len(sentinel) == 1  # one token, which decoding leaves out (as transformers does)


def batched(rows: list[list[int]], pad: int) -> torch.Tensor:
    out = torch.full((len(rows), max(map(len, rows))), pad)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row)
    return out


def test_logits_equal_transformers(t5: T5Case, toy_data: Path) -> None:
    order = t5_order(len(t5.tokenizer))
    texts = sources(toy_data)
    tokenizer = t5.ckpt.tokenizers.source
    src = [tokenizer.encode(t) for t in texts]
    tgt = [tokenizer.encode(t)[:20] for t in lines("test2016", "de", INPUTS, toy_data)]
    tgt_in = batched([[BOS_ID, *ids] for ids in tgt], PAD_ID)
    theirs_in = batched([[order[i] for i in [BOS_ID, *ids]] for ids in tgt], 0)
    batch = t5.tokenizer(texts, return_tensors="pt", padding=True)
    with torch.no_grad():
        ours = t5.ckpt.model(batched(src, PAD_ID), tgt_in).logits
        hf = t5.model(**batch, decoder_input_ids=theirs_in).logits
    keep = list(range(1, len(order)))  # every row but tformer's new <pad>
    columns = torch.tensor([order[i] for i in keep])
    real = batched([[1] * (len(ids) + 1) for ids in tgt], 0).bool()
    difference = (ours[real][:, keep] - hf[real][:, columns]).abs().max()
    assert difference < 1e-4, difference


@pytest.mark.parametrize("beams", [1, 4])
def test_outputs_equal_generate(t5: T5Case, beams: int, toy_data: Path) -> None:
    order = t5_order(len(t5.tokenizer))
    texts = sources(toy_data)
    src = [t5.ckpt.tokenizers.source.encode(t) for t in texts]
    settings = DecodingConfig(beam_size=beams, max_new_tokens=MAX_NEW, length_penalty=1.0)
    ours = [[order[i] for i in row[0].ids] for row in decode_texts(t5.ckpt.model, src, settings)]
    batch = t5.tokenizer(texts, return_tensors="pt", padding=True)

    # tformer never predicts <bos> (T5's <pad>, its decoder start) and leaves it out of the
    # softmax: the same for transformers, before its softmax.
    def no_pad(module: Any, inputs: Any, logits: torch.Tensor) -> torch.Tensor:
        return logits.index_fill(-1, torch.tensor([0]), float("-inf"))

    hook = t5.model.lm_head.register_forward_hook(no_pad)
    try:
        with torch.no_grad():
            generated = t5.model.generate(
                **batch, num_beams=beams, max_new_tokens=MAX_NEW, length_penalty=1.0,
                do_sample=False, forced_eos_token_id=None,
            )  # fmt: skip
    finally:
        hook.remove()
    theirs = []
    for row in generated.tolist():
        row = row[1:]
        theirs.append(row[: row.index(1)] if 1 in row else row)
    assert theirs == ours


@pytest.mark.slow
def test_cli_import_then_generate(t5: T5Case, tmp_path: Path) -> None:
    out = tmp_path / "t5"
    imported = tformer("import", t5.folder, out)
    assert imported.exit_code == 0, imported.output
    generated = tformer("generate", out, PREFIX + "A man in a blue shirt.")
    assert generated.exit_code == 0, generated.output
    assert generated.stdout.strip()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"feed_forward_proj": "gated-silu"}, "feed_forward_proj 'gated-silu'"),
        ({"feed_forward_proj": "gated-gelu", "d_ff": 60}, "d_ff 60"),
        ({"num_heads": 3}, "num_heads x d_kv 24 != d_model"),
    ],
    ids=["gated-silu", "width", "heads"],
)  # fmt: skip
def test_what_tformer_cannot_express_is_refused_in_one_line(
    t5: T5Case, tmp_path: Path, change: dict[str, object], message: str
) -> None:
    folder = tmp_path / "other"
    folder.mkdir()
    config = json.loads((t5.folder / "config.json").read_text())
    config.update(change)
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=message):
        import_model(folder, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_published_v1_1_folder_with_its_own_output_projection(
    t5: T5Case, tmp_path: Path, toy_data: Path
) -> None:
    """T5 v1.1 as published (written by transformers 4): ``tie_word_embeddings: false`` and an
    ``lm_head.weight`` of its own. transformers 5 ties it on loading, so the reference is the
    formula: logits = the decoder's last hidden state (after its final norm) x lm_headᵀ."""
    from safetensors.torch import load_file, save_file

    if t5.model.config.feed_forward_proj != "gated-gelu":
        pytest.skip("a v1.1 layout")
    folder = tmp_path / "published"
    shutil.copytree(t5.folder, folder)
    config = json.loads((folder / "config.json").read_text())
    del config["scale_decoder_outputs"]
    config["tie_word_embeddings"] = False
    (folder / "config.json").write_text(json.dumps(config))
    tensors = load_file(folder / "model.safetensors")
    head = torch.randn(tensors["shared.weight"].shape, generator=torch.Generator().manual_seed(3))
    save_file({**tensors, "lm_head.weight": head}, folder / "model.safetensors")
    ckpt = load_checkpoint(import_model(folder, tmp_path / "imported"))
    assert not ckpt.model_config.tie_embeddings and not ckpt.model_config.output_scale

    order = t5_order(len(t5.tokenizer))
    texts = sources(toy_data)[:4]
    tokenizer = ckpt.tokenizers.source
    tgt = [tokenizer.encode(t)[:12] for t in lines("test2016", "de", 4, toy_data)]
    theirs_in = batched([[order[i] for i in [BOS_ID, *ids]] for ids in tgt], 0)
    batch = t5.tokenizer(texts, return_tensors="pt", padding=True)
    with torch.no_grad():
        ours = ckpt.model(batched([tokenizer.encode(t) for t in texts], PAD_ID),
                          batched([[BOS_ID, *ids] for ids in tgt], PAD_ID)).logits  # fmt: skip
        hidden = t5.model(**batch, decoder_input_ids=theirs_in,
                          output_hidden_states=True).decoder_hidden_states[-1]  # fmt: skip
    want = hidden @ head.T
    keep = list(range(1, len(order)))
    columns = torch.tensor([order[i] for i in keep])
    real = batched([[1] * (len(ids) + 1) for ids in tgt], 0).bool()
    difference = (ours[real][:, keep] - want[real][:, columns]).abs().max()
    assert difference < 1e-4, difference


def test_decoded_text_drops_sentinels_as_transformers(t5: T5Case, toy_data: Path) -> None:
    """T5's <extra_id_N> are special tokens: decoding leaves them out, as transformers'
    decode(skip_special_tokens=True) does, on the same ids; shown, they keep their names."""
    tokenizer = t5.ckpt.tokenizers.target
    mapping = to_tformer_ids(t5_order(len(t5.tokenizer)))
    for text in ["A dog <extra_id_0> the park <extra_id_7>.", *sources(toy_data)[:5]]:
        hf_ids = t5.tokenizer(text)["input_ids"]  # closed by </s>
        ours = [mapping[i] for i in hf_ids]
        assert tokenizer.decode(ours) == t5.tokenizer.decode(hf_ids, skip_special_tokens=True)
    sentinel = tokenizer.encode("<extra_id_2>")
    assert tokenizer.decode(sentinel) == "" and tokenizer.tokens(sentinel) == ["<extra_id_2>"]


def test_score_shows_t5s_names_and_a_readable_perplexity(t5: T5Case) -> None:
    result = tformer("score", t5.ckpt.path, "A dog runs.", "a man in a blue shirt")
    assert result.exit_code == 0, result.output
    out = " ".join(result.stdout.split())
    assert "</s>" in out and "<eos>" not in out
    perplexity = re.search(r"perplexity (\S+);", out)
    assert perplexity is not None and re.fullmatch(r"\d\.\d{3}e\+\d\d|\d+\.\d{3}", perplexity[1])


def test_inspect_attention_max_new_tokens_bounds_the_translation(
    t5: T5Case, tmp_path: Path
) -> None:
    saved = tmp_path / "map.json"
    result = tformer("inspect-attention", t5.ckpt.path, PREFIX + "A dog runs.",
                     "--max-new-tokens", "2", "--save", saved)  # fmt: skip
    assert result.exit_code == 0, result.output
    record = json.loads(saved.read_text())
    assert len(record["rows"]) <= 3  # what <bos> and at most 2 new tokens predict
    assert record["columns"][-1] == "</s>"  # the source's </s>, by T5's name
