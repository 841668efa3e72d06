"""The benchmark scripts run in CI as smoke tests (tiny sizes) so they cannot rot."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tformer.fast.malloc import glibc
from tformer.training.run import TrainResult

pytestmark = pytest.mark.slow  # the fast tier (-m "not slow") leaves this file out

ROOT = Path(__file__).resolve().parents[1]
SHARED_MULTI30K = ROOT.parent / "shared" / "data" / "multi30k"


def run_script(name: str, *args: str, env: dict[str, str] | None = None) -> list[dict]:
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / name), *args],
                          capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def test_train_speed_smoke() -> None:
    records = run_script("train_speed.py", "--smoke", "--dropout", "0", "--profile")
    assert records[0]["reference"].startswith("dense matmul") and records[0]["bf16_gflops"] > 0
    measured = [r for r in records if "ms_per_step" in r]
    assert {r["impl"] for r in measured} >= {"tformer", "torch.nn.Transformer"}
    assert {r["precision"] for r in measured} == {"fp32", "bf16"}
    assert all(r["target_tokens_per_s"] > 0 and r["peak_rss_mb"] > 0 for r in measured)
    # The options reach every configuration's own process; the host's share is part of a step.
    assert {r["dropout"] for r in measured} == {0.0}
    assert all(0 < r["host_ms_per_step"] <= r["ms_per_step"] for r in measured)
    # Every implementation runs with the allocator settings tformer makes for itself.
    assert {r["keep_freed_memory"] for r in measured} == {glibc() is not None}
    # A step's time beyond its products at the run's best reference, and the profiled split:
    # the products are the matrix products, the rest is named by what it does.
    end = next(r for r in records if "reference_end" in r)
    assert end["bf16_gflops"] >= records[0]["bf16_gflops"]
    for r in measured:
        peak = end["fp32_gflops" if r["precision"] == "fp32" else "bf16_gflops"]
        ideal = r["model_gflop_per_step"] / peak * 1000
        assert r["non_product_ms"] == pytest.approx(r["ms_per_step"] - ideal, abs=0.06)
        groups = {g["group"]: g for g in r["op_groups"]}
        assert {"products", "optimizer", "loss", "attention", "norm"} <= set(groups)
        assert set(groups["products"]["top_ops"]) <= {"aten::mm", "aten::addmm", "aten::linear",
                                                      "aten::matmul"}
        assert groups["products"]["mb_read_per_step"] > 0 and groups["products"]["ms_per_step"] > 0


@pytest.mark.skipif(not SHARED_MULTI30K.is_dir(),
                    reason="../shared/data/multi30k is not present beside the project")
def test_multi30k_pipeline_smoke(tmp_path: Path) -> None:
    records = run_script("multi30k.py", "--smoke", "--out", str(tmp_path / "m30k"))
    card = records[-1]
    assert card["split"] == "test" and card["pairs"] == 20
    assert "bleu_signature" in card["metrics"]


def test_decode_speed_smoke() -> None:
    # The script turns huge pages on for large tensors, as tformer does for itself, unless the
    # caller has set the switch: the caller's setting wins.
    env = {**os.environ, "THP_MEM_ALLOC_ENABLE": "0"}
    records = run_script("decode_speed.py", "--smoke", env=env)
    ours = [r for r in records if r.get("impl") == "tformer"]
    assert {r["thp_mem_alloc"] for r in ours} == {"0"}
    cases = {(r["strategy"], r["batch"]) for r in ours}
    assert cases == {("greedy", 1), ("greedy", 4), ("beam4", 1)}
    assert {r["cache"] for r in ours} == {True, False}
    int8 = {(r["strategy"], r["batch"]) for r in records if r.get("impl") == "tformer-int8"}
    assert int8 == cases
    assert all(r["tokens_per_s"] > 0 and r["new_tokens"] > 0 for r in ours)
    hf = [r for r in records if r.get("note") == "HF Marian with tformer's weights"]
    if hf:  # transformers installed: the same weights must give the same greedy output
        assert hf[0]["same_greedy_output"] and hf[0]["max_logit_diff"] < 1e-3


def test_loss_speed_smoke() -> None:
    records = run_script("loss_speed.py", "--smoke")
    configs = {(r["impl"], r["precision"]) for r in records}
    assert configs == {(i, p) for i in ("tformer", "F.cross_entropy") for p in ("fp32", "bf16")}
    assert all(0 < r["min_ms"] <= r["median_ms"] <= r["max_ms"] for r in records)


def test_sharing_smoke() -> None:
    records = run_script("sharing.py", "--smoke")
    assert records[0]["cores"] >= 1
    (row,) = records[1:]
    assert row["policy"] == "tformer"
    assert row["train_alone_tokens_per_s"] > 0 and row["train_shared_tokens_per_s"] > 0
    assert row["generate_alone_sentences_per_s"] > 0
    assert row["two_trainings_tokens_per_s"] > 0


def test_data_scale_smoke() -> None:
    records = run_script("data_scale.py", "--smoke")
    stages = [r["stage"] for r in records]
    assert stages == ["prepare", "prepare --streaming", "train on the prepared folder",
                      "train on the text (id cache filled)"]
    assert all(r["pairs"] == 2000 and r["peak_rss_mb"] > 0 and r["pairs_per_s"] > 0
               for r in records)
    assert all("first_step_s" in r for r in records if r["stage"].startswith("train"))


def test_variant_lab_smoke(tmp_path: Path) -> None:
    # Every run trains for the same wall-clock time (the hour's question) and is scored on the
    # validation split, where choices are made.
    run_script("variant_lab.py", "--smoke", "--time-budget", "3s", "--out",
               str(tmp_path / "runs"), "--results", str(tmp_path / "results"))
    report = json.loads((tmp_path / "results" / "variant-lab-smoke.json").read_text())
    assert [Path(r["path"]).name for r in report["runs"]] == ["paper", "gqa-1"]
    assert report["differing_fields"] == ["kv_heads"]
    assert all(set(r["results"]) == {"validation"} for r in report["runs"])
    assert all(r["results"]["validation"]["bleu"] is not None for r in report["runs"])
    assert report["lab"]["time_budget"] == "3s" and report["lab"]["steps"] is None
    for run in report["runs"]:
        records = (Path(run["path"]) / "metrics.jsonl").read_text().splitlines()
        assert json.loads(records[0])["time_budget"] == 3.0
    assert (tmp_path / "results" / "variant-lab-smoke.png").read_bytes()[:4] == b"\x89PNG"
    table = (tmp_path / "results" / "variant-lab-smoke.md").read_text()
    assert "3s of training each" in table and "| validation BLEU |" in table
    assert "| gqa-1 | `--kv-heads 1` |" in table


def test_variant_lab_recipe_steps_are_recipes() -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import variant_lab
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    from tformer.config import RECIPES

    named = [flags[flags.index("--recipe") + 1] for flags in variant_lab.RECIPE_STEPS.values()]
    assert named[0] == "multi30k" and set(named) <= set(RECIPES)


def test_serve_load_smoke(trained: TrainResult) -> None:
    pytest.importorskip("fastapi", reason="the serve extra (fastapi, uvicorn) is not installed")
    records = run_script("serve_load.py", "--checkpoint", str(trained.run_dir), "--clients",
                         "1,4", "--seconds", "1", "--max-new-tokens", "8")
    assert [r["clients"] for r in records] == [1, 4]
    for record in records:
        assert record["errors"] == 0 and record["requests"] > 0
        assert record["requests_per_s"] > 0 and record["new_tokens_per_s"] > 0
        assert record["p50_ms"] <= record["p95_ms"] <= record["p99_ms"]


def test_import_speed_smoke() -> None:
    pytest.importorskip("sentencepiece")
    pytest.importorskip("transformers")
    records = run_script("import_speed.py", "--smoke")
    imports = [r for r in records if r.get("benchmark") == "import_speed"]
    assert len(imports) == 1
    record = imports[0]
    assert record["seconds"] > 0 and record["peak_rss_mb"] >= record["baseline_rss_mb"] > 0
    assert record["model_vocab"] == 2000 and record["weights_mb"] > 0
    # The imported checkpoint decodes next to HF generate (and CTranslate2 when installed).
    speeds = [r for r in records if r.get("benchmark") == "import_decode_speed"]
    impls = {r["impl"] for r in speeds}
    assert {"tformer", "tformer-int8", "hf-generate"} <= impls
    assert {(r["strategy"], r["batch"]) for r in speeds} == {("greedy", 1), ("beam4", 1),
                                                             ("greedy", 4)}  # fmt: skip
    assert all(r["tokens_per_s"] > 0 for r in speeds)
    # The float32 ceiling reads a decoder step's weights: self-attention's query, keys and
    # values and output, cross-attention's query and output, the feed-forward, the output.
    (ceiling,) = [r for r in records if r.get("benchmark") == "import_decode_ceiling"]
    d, ff, vocab = 32, 64, 2000
    floats = 4 * d * d + 2 * d * d + 2 * d * ff + vocab * d
    assert ceiling["mb_per_token"] == round(4 * floats / 1e6, 1)
    assert ceiling["tokens_per_s"] > 0
    # Both reads are timed and the faster one bounds the speed.
    assert ceiling["ms_per_token"] == min(ceiling["ms_row_product"], ceiling["ms_sum"])
    assert ceiling["read"] in {"row product", "sum"}


def test_gpt2_decode_speed_smoke() -> None:
    pytest.importorskip("transformers")
    records = run_script("gpt2_decode_speed.py", "--smoke", "--ablate", "5")
    decoding = [r for r in records if r["benchmark"] == "gpt2_decode_speed"]
    assert [r["implementation"] for r in decoding] == ["huggingface", "tformer", "tformer-int8"]
    assert all(r["tokens_per_s"] > 0 and r["peak_rss_mb"] > 0 for r in decoding)
    (ceiling,) = [r for r in records if r["benchmark"] == "gpt2_decode_ceiling"]
    assert ceiling["mb_per_token"] > 0 and ceiling["tokens_per_s"] > 0
    (ablated,) = [r for r in records if r["benchmark"] == "gpt2_ablate"]
    assert ablated["heads"] == 8 and ablated["measurements"] == 9 and ablated["documents"] == 5


def test_t5_decode_speed_smoke() -> None:
    pytest.importorskip("transformers")
    records = run_script("t5_decode_speed.py", "--smoke")
    assert [r["implementation"] for r in records] == [
        "huggingface", "tformer-plain", "tformer", "tformer-int8",
    ]  # fmt: skip
    assert all(r["tokens_per_s"] > 0 and r["peak_rss_mb"] > 0 for r in records)


def test_student_speed_smoke() -> None:
    records = run_script("student_speed.py", "--smoke", "--student",
                         "n_encoder_layers=4,n_decoder_layers=1")  # fmt: skip
    assert all(r["student"] == {"n_encoder_layers": 4, "n_decoder_layers": 1} for r in records)
    # The encoder is timed alone on each case's sources: a part of the whole decode.
    assert all(r["encode_ms"] > 0 and r["encode_share"] > 0 for r in records)
    names = {"teacher", "teacher-int8", "student", "student-int8"}
    cases = {("beam4", 1), ("greedy", 32), ("beam4", 32)}
    assert {(r["strategy"], r["batch"]) for r in records} == cases
    for case in cases:
        rows = [r for r in records if (r["strategy"], r["batch"]) == case]
        assert {r["implementation"] for r in rows} == names
        assert all(r["tokens_per_s"] > 0 and r["new_tokens"] == 4 * case[1] for r in rows)


def test_noisy_corpus_noises_only_the_training_split_and_judges_a_filter(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    sources = [f"a dog number {i} runs ." for i in range(200)]
    targets = [f"ein Hund Nummer {i} rennt ." for i in range(200)]
    for split in ("train", "val"):
        (data / f"{split}.en").write_text("\n".join(sources) + "\n")
        (data / f"{split}.de").write_text("\n".join(targets) + "\n")
    noisy = tmp_path / "noisy"
    made = run_script("noisy_corpus.py", str(data), str(noisy), "--src", "en", "--tgt", "de")
    assert made == [{"out": str(noisy), "pairs": 200, "clean": 170, "misaligned": 20,
                     "copied": 10}]  # fmt: skip
    labels = [json.loads(line)["noise"] for line in (tmp_path / "noisy-noise.jsonl").open()]
    written = (noisy / "train.de").read_text().splitlines()
    assert (noisy / "train.en").read_text().splitlines() == sources
    for label, source, target, written_target in zip(labels, sources, targets, written,
                                                     strict=True):  # fmt: skip
        want = {"clean": written_target == target, "copied": written_target == source,
                "misaligned": written_target in targets and written_target != target}
        assert want[label], (label, source, written_target)
    for name in ("val.en", "val.de"):  # the held-out splits as they were
        assert (noisy / name).read_bytes() == (data / name).read_bytes()
    # A filter that dropped every copy and the first 5 misaligned pairs, and 1 clean pair:
    drop = {i for i, label in enumerate(labels) if label == "copied"}
    drop |= set([i for i, label in enumerate(labels) if label == "misaligned"][:5])
    drop.add(labels.index("clean"))
    scores = tmp_path / "scores.jsonl"
    scores.write_text("".join(json.dumps({"index": i, "kept": i not in drop}) + "\n"
                              for i in range(200)))  # fmt: skip
    judged = run_script("noisy_corpus.py", "--judge", str(tmp_path / "noisy-noise.jsonl"),
                        str(scores))  # fmt: skip
    assert judged == [{"clean": {"pairs": 170, "dropped": 1},
                       "misaligned": {"pairs": 20, "dropped": 5},
                       "copied": {"pairs": 10, "dropped": 10}}]  # fmt: skip
