"""tformer export --to huggingface of GPT-2, BERT and T5, held to transformers: a real model of
each family (tiny config, random weights, tokenizer trained here; the import tests' fixtures)
imported, exported back with the CLI, and loaded with transformers' Auto classes: the same
token ids, logits within 1e-4, greedy outputs (GPT-2, T5) or fill-mask's top 5 (BERT). Models
trained from scratch by tformer export with tformer's own logits; what no family can express
is refused in one line, OUT not created."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from tests.imports.conftest import lines, tformer  # noqa: E402
from tests.imports.test_bert import BertCase, bert  # noqa: E402, F401
from tests.imports.test_gpt2 import GPT2Case, gpt2  # noqa: E402, F401
from tests.imports.test_t5 import T5Case, t5  # noqa: E402, F401
from tformer.checkpoint.store import load_checkpoint  # noqa: E402
from tformer.config import BOS_ID  # noqa: E402

AUTO = transformers


def export(ckpt: Path, out: Path) -> Path:
    run = tformer("export", ckpt, out, "--to", "huggingface")
    assert run.exit_code == 0, run.output
    return out


def test_gpt2_round_trip(gpt2: GPT2Case, toy_data: Path, tmp_path: Path) -> None:  # noqa: F811
    out = export(gpt2.out, tmp_path / "hf")
    model = AUTO.AutoModelForCausalLM.from_pretrained(out).eval()
    tokenizer = AUTO.AutoTokenizer.from_pretrained(out)
    assert type(model).__name__ == "GPT2LMHeadModel"
    texts = lines("val", "en", 20, toy_data)
    assert tokenizer(texts).input_ids == gpt2.tokenizer(texts).input_ids
    for text in texts:
        ids = torch.tensor([gpt2.tokenizer.encode(text)[:40]])
        with torch.no_grad():
            torch.testing.assert_close(
                model(ids).logits, gpt2.model(ids).logits, atol=1e-4, rtol=1e-4
            )
    for text in texts[:6]:
        prompt = tokenizer([" ".join(text.split()[:4])], return_tensors="pt")
        eot = gpt2.tokenizer.eos_token_id
        ours = model.generate(**prompt, max_new_tokens=12)
        theirs = gpt2.model.generate(
            **prompt, max_new_tokens=12, do_sample=False, eos_token_id=eot, pad_token_id=eot
        )
        assert ours.tolist() == theirs.tolist()


def test_bert_round_trip(bert: BertCase, toy_data: Path, tmp_path: Path) -> None:  # noqa: F811
    out = export(bert.out, tmp_path / "hf")
    model = AUTO.AutoModelForMaskedLM.from_pretrained(out).eval()
    tokenizer = AUTO.AutoTokenizer.from_pretrained(out)
    assert type(model).__name__ == "BertForMaskedLM"
    texts = lines("val", "en", 20, toy_data)
    assert tokenizer(texts).input_ids == bert.tokenizer(texts).input_ids
    for text in texts:
        batch = bert.tokenizer(text, truncation=True, max_length=64, return_tensors="pt")
        with torch.no_grad():
            torch.testing.assert_close(
                model(**batch).logits, bert.model(**batch).logits, atol=1e-4, rtol=1e-4
            )
    ours = transformers.pipeline("fill-mask", model=model, tokenizer=tokenizer)
    theirs = transformers.pipeline("fill-mask", model=bert.model, tokenizer=bert.tokenizer)
    for text in texts[:6]:
        words = text.split()
        words[len(words) // 2] = tokenizer.mask_token
        masked = " ".join(words)
        found = [(r["token"], round(r["score"], 5)) for r in ours(masked, top_k=5)]
        expected = [(r["token"], round(r["score"], 5)) for r in theirs(masked, top_k=5)]
        assert found == expected


def test_t5_round_trip(t5: T5Case, toy_data: Path, tmp_path: Path) -> None:  # noqa: F811
    out = export(t5.ckpt.path, tmp_path / "hf")
    model = AUTO.AutoModelForSeq2SeqLM.from_pretrained(out).eval()
    tokenizer = AUTO.AutoTokenizer.from_pretrained(out)
    assert type(model).__name__ == "T5ForConditionalGeneration"
    texts = lines("test2016", "en", 12, toy_data)
    assert tokenizer(texts).input_ids == t5.tokenizer(texts).input_ids
    batch = t5.tokenizer(texts, return_tensors="pt", padding=True)
    start = torch.zeros(len(texts), 1, dtype=torch.long)
    with torch.no_grad():
        ours = model(**batch, decoder_input_ids=start).logits
        theirs = t5.model(**batch, decoder_input_ids=start).logits
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        found = model.generate(**batch, max_new_tokens=10)
    expected = t5.model.generate(**batch, max_new_tokens=10, suppress_tokens=[0])
    assert found.tolist() == expected.tolist()


# -- models trained from scratch by tformer ----------------------------------------------------

STEPS = 12
# family -> the variants it is trained with (each export folds in what its target lacks: the
# embedding scale, the paper's sinusoids, GPT-2's missing logits bias, T5's score scaling).
SCRATCH = {
    "decoder-only": dict(norm="pre", output_bias=True, activation="gelu_tanh"),
    "encoder-only": dict(embedding_norm=True, mlm_head=True, bos_first=True, positions="learned"),
    "encoder-decoder": dict(positions="relative", relative_buckets=8, relative_max_distance=16,
                            linear_bias=False, normalization="rmsnorm", norm="pre",
                            output_scale=True, activation="swiglu", source_eos=True),
}  # fmt: skip


@pytest.fixture(scope="module", params=list(SCRATCH))
def scratch(request: pytest.FixtureRequest, toy_data: Path, tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201, E501
    from tformer.config import ModelConfig, TrainConfig
    from tformer.training.run import train

    arch = request.param
    small = dict(d_model=32, n_heads=4, n_encoder_layers=1, n_decoder_layers=1, d_ff=64,
                 max_len=64, dropout=0.0)  # fmt: skip
    model = ModelConfig(arch=arch, **small, **SCRATCH[arch])
    data = {"data": str(toy_data)} if arch == "encoder-decoder" else {}  # else the demo text
    config = TrainConfig(**data, max_tokens=1024, lr=3e-3, warmup_steps=4, max_steps=STEPS,
                         eval_every=STEPS, save_every=STEPS, log_every=STEPS, seed=0)  # fmt: skip
    out = tmp_path_factory.mktemp("scratch") / arch
    ckpt = train(model, config, out=out, vocab_size=96).checkpoint
    return ckpt, export(ckpt, tmp_path_factory.mktemp("scratch-hf") / arch)


def test_scratch_models_export_with_tformers_logits(scratch) -> None:  # noqa: ANN001
    ckpt_path, out = scratch
    ckpt = load_checkpoint(ckpt_path)
    model, config = ckpt.model.eval(), ckpt.model_config
    tokenizer = AUTO.AutoTokenizer.from_pretrained(out)
    text = "12 March 2021 is a date"
    ids = ckpt.tokenizers.source.encode(text)
    with torch.no_grad():
        if config.arch == "decoder-only":
            hf = AUTO.AutoModelForCausalLM.from_pretrained(out).eval()
            given = tokenizer(text, return_tensors="pt").input_ids
            assert given[0].tolist() == [BOS_ID, *ids]
            ours = model(torch.zeros(1, 0, dtype=torch.long), given).logits
            torch.testing.assert_close(hf(given).logits, ours, atol=1e-4, rtol=1e-4)
        elif config.arch == "encoder-only":
            hf = AUTO.AutoModelForMaskedLM.from_pretrained(out).eval()
            rows = [0, 3, 1, 2, 4, *range(5, config.src_vocab_size)]
            given = tokenizer(text, return_tensors="pt")
            assert [rows[i] for i in given.input_ids[0].tolist()] == [BOS_ID, *ids, 2]
            ours = model(torch.tensor([[*ids, 2]])).logits[..., rows]
            torch.testing.assert_close(hf(**given).logits[:, 1:], ours, atol=1e-4, rtol=1e-4)
        else:
            hf = AUTO.AutoModelForSeq2SeqLM.from_pretrained(out).eval()
            given = tokenizer(text, return_tensors="pt").input_ids
            assert given[0].tolist() == [i - 1 for i in [*ids, 2]]
            target = torch.tensor([[BOS_ID, *ids[:3]]])
            ours = model(torch.tensor([ids]), target).logits[..., 1:]
            theirs = hf(input_ids=given, decoder_input_ids=target - 1).logits
            torch.testing.assert_close(theirs, ours, atol=1e-4, rtol=1e-4)


# -- refused ----------------------------------------------------------------------------------

REFUSED = {  # arch, variants -> the flags the refusal must name
    "gpt2-rope": ("decoder-only", dict(positions="rope", kv_heads=2, norm="post"),
                  ["--norm post", "--positions rope", "--kv-heads 2", "GPT2LMHeadModel"]),
    "bert-plain": ("encoder-only", dict(normalization="rmsnorm"),
                   ["--normalization rmsnorm", "no --embedding-norm", "no --mlm-head"]),
    "t5-biases": ("encoder-decoder", dict(positions="relative", norm="pre", activation="geglu"),
                  ["--normalization layernorm", "--activation geglu", "--linear-bias"]),
}  # fmt: skip


@pytest.mark.parametrize("case", list(REFUSED))
def test_what_no_family_expresses_is_refused_in_one_line(case: str, tmp_path: Path) -> None:
    from tformer.checkpoint.store import Tokenizers, write_checkpoint_files
    from tformer.config import ModelConfig, TrainConfig
    from tformer.data.tokenizer import train_tokenizer
    from tformer.model import build_model

    arch, changes, named = REFUSED[case]
    specials = ("<mask>",) if arch == "encoder-only" else ()
    tokenizer = train_tokenizer(["one two three four"] * 50, vocab_size=40, specials=specials)
    size = tokenizer.vocab_size
    config = ModelConfig(arch=arch, d_model=32, n_heads=4, n_encoder_layers=1,
                         n_decoder_layers=1, d_ff=64, max_len=32, src_vocab_size=size,
                         tgt_vocab_size=size, **changes)  # fmt: skip
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    write_checkpoint_files(
        ckpt,
        model=build_model(config),
        train_config=TrainConfig(),
        tokenizers=Tokenizers(tokenizer, tokenizer),
    )
    out = tmp_path / "out"
    run = tformer("export", ckpt, out, "--to", "huggingface")
    assert run.exit_code == 2, run.output
    message = run.stderr.strip()
    assert "\n" not in message and not out.exists()
    for flag in named:
        assert flag in message, message


def test_marian_generation_config_takes_max_new_tokens_without_a_warning(
    trained_variant, inputs: list[str], tmp_path: Path  # noqa: ANN001
) -> None:
    out = export(trained_variant("post-relu-shared-tied"), tmp_path / "hf")
    model = AUTO.AutoModelForSeq2SeqLM.from_pretrained(out)
    tokenizer = AUTO.AutoTokenizer.from_pretrained(out)
    assert model.generation_config.max_length == AUTO.GenerationConfig().max_length
    batch = tokenizer(inputs[:2], return_tensors="pt", padding=True)
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    library = logging.getLogger("transformers")  # its loggers do not propagate to the root
    library.addHandler(handler)
    try:
        model.generate(**batch, max_new_tokens=5)
    finally:
        library.removeHandler(handler)
    assert not [r.getMessage() for r in records if "max_length" in r.getMessage()]
