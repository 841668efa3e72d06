"""Evaluation: translate a split, score it with sacreBLEU / chrF (``tformer.metrics``), and
write a result card."""

from __future__ import annotations

import hashlib
import json
import math
import platform
import subprocess
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from tformer.analysis.language import LanguageEvaluation
from tformer.checkpoint.store import Checkpoint, Tokenizers
from tformer.data.batching import Batch, BatchPlan
from tformer.data.pairs import encode_pairs
from tformer.data.sources import TextPair
from tformer.decoding.ensemble import Decodable
from tformer.decoding.settings import DecodingConfig
from tformer.decoding.text import translate
from tformer.device import cpuinfo
from tformer.folders import MarkedFolder
from tformer.metrics import EVAL_BATCH_TOKENS, Scores, corpus_scores, perplexity_text
from tformer.paths import json_loads, read_small_text
from tformer.training.loss import sequence_loss
from tformer.version import __version__


def teacher_forced_batches(
    tokenizers: Tokenizers, pairs: Sequence[TextPair], max_len: int, device: torch.device
) -> list[Batch]:
    """``pairs`` tokenised and cut into token-budget batches on ``device``, in a fixed order."""
    split = encode_pairs(pairs, tokenizers.source, tokenizers.target, max_len)
    return [
        batch.to(device) for batch in BatchPlan(split.pairs, EVAL_BATCH_TOKENS, seed=0).batches(0)
    ]


@torch.no_grad()
def batches_loss(model: Decodable, batches: Sequence[Batch]) -> tuple[float, int]:
    """Mean per-token cross-entropy of ``model`` over ``batches``, and the number of tokens."""
    total, tokens = 0.0, 0
    for batch in batches:
        total += float(sequence_loss(model(batch.src, batch.tgt_in).logits, batch.tgt_out))
        tokens += batch.n_target_tokens
    return total / max(tokens, 1), tokens


def teacher_forced_loss(
    ckpt: Checkpoint, pairs: Sequence[TextPair], model: Decodable | None = None
) -> tuple[float, int]:
    """Mean per-token cross-entropy under teacher forcing, and the number of target tokens;
    of ``model`` (an ensemble with ``ckpt``'s tokenizers) when given, else of ``ckpt``'s."""
    model = ckpt.model if model is None else model
    device = next(model.parameters()).device
    batches = teacher_forced_batches(ckpt.tokenizers, pairs, model.config.max_len, device)
    return batches_loss(model, batches)


@dataclass
class Evaluation:
    split: str
    pairs: int
    scores: Scores
    loss: float
    perplexity: float
    wall_time: float
    new_tokens_per_s: float
    hypotheses: list[str] = field(repr=False)
    decoding: dict[str, Any] = field(default_factory=dict)


def evaluate_pairs(
    ckpt: Checkpoint,
    pairs: Sequence[TextPair],
    *,
    split: str = "test",
    decoding: DecodingConfig | None = None,
    batch_size: int = 64,
    model: Decodable | None = None,
) -> Evaluation:
    """Translate ``pairs``' sources and score them against their targets, with ``model``
    (an ensemble with ``ckpt``'s tokenizers) when given, else with ``ckpt``'s."""
    decoding = decoding or DecodingConfig()
    model = ckpt.model if model is None else model
    started = time.perf_counter()
    sources = [s for s, _ in pairs]
    generations = translate(model, ckpt.tokenizers, sources, decoding, batch_size=batch_size)
    outputs = [g[0].text for g in generations]
    decode_time = time.perf_counter() - started
    new_tokens = sum(len(g[0].hypothesis.ids) + 1 for g in generations)
    loss, _ = teacher_forced_loss(ckpt, pairs, model)
    return Evaluation(
        split=split,
        pairs=len(pairs),
        scores=corpus_scores(outputs, [t for _, t in pairs]),
        loss=round(loss, 5),
        perplexity=round(math.exp(min(loss, 50.0)), 4),
        wall_time=round(time.perf_counter() - started, 2),
        new_tokens_per_s=round(new_tokens / max(decode_time, 1e-9), 1),
        hypotheses=outputs,
        decoding=asdict(decoding),
    )


# -- the result card --------------------------------------------------------------------------

BUNDLED_DATES = "bundled dates (data/)"  # a card's "data" when it measured the bundled set


def data_fingerprint(pairs: Sequence[TextPair]) -> str:
    """SHA-256 of the split's text, so a card names exactly the data it was measured on."""
    digest = hashlib.sha256()
    for source, target in pairs:
        digest.update(source.encode("utf-8") + b"\t" + target.encode("utf-8") + b"\n")
    return digest.hexdigest()


def git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            cwd=Path(__file__).resolve().parent,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


# CPU features that decide which precision and kernels are fast, worth naming in a result.
_CPU_FEATURES = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")


def cpu_description() -> dict[str, Any]:
    """The CPU's model name and its speed-relevant features (from /proc/cpuinfo on Linux)."""
    info = cpuinfo()
    name = info.get("model name") or platform.processor() or platform.machine()
    flags = set(info.get("flags", "").split())
    return {"cpu": name, "cpu_features": [f for f in _CPU_FEATURES if f in flags]}


def hardware() -> dict[str, Any]:
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        **cpu_description(),
        "cpu_count": torch.get_num_threads(),
        "torch": torch.__version__,
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def result_card(
    ckpt: Checkpoint, result: Evaluation, *, data: str | None, pairs: Sequence[TextPair]
) -> dict[str, Any]:
    return {
        "tformer_version": __version__,
        "git_commit": git_commit(),
        "checkpoint": str(ckpt.path),
        "step": ckpt.step,
        "data": data or BUNDLED_DATES,
        "split": result.split,
        "pairs": result.pairs,
        "data_sha256": data_fingerprint(pairs),
        "metrics": {
            "bleu": result.scores.bleu,
            "bleu_signature": result.scores.bleu_signature,
            "bleu_detail": result.scores.bleu_detail,
            "chrf": result.scores.chrf,
            "chrf_signature": result.scores.chrf_signature,
            "loss": result.loss,
            "perplexity": result.perplexity,
        },
        "decoding": result.decoding,
        "model": ckpt.model_config.to_dict(),
        "train": ckpt.train_config.to_dict(),
        "hardware": hardware(),
        "wall_time_s": result.wall_time,
        "new_tokens_per_s": result.new_tokens_per_s,
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }


def card_markdown(card: dict[str, Any]) -> str:
    m = card["metrics"]
    lines = [
        f"# tformer evaluation: {card['data']} [{card['split']}]",
        "",
        "| metric | value | signature |",
        "|---|---:|---|",
        f"| sacreBLEU | {m['bleu']:.2f} | `{m['bleu_signature']}` |",
        f"| chrF | {m['chrf']:.2f} | `{m['chrf_signature']}` |",
        f"| loss (teacher forcing) | {m['loss']:.4f} | |",
        f"| perplexity | {perplexity_text(m['perplexity'])} | |",
        "",
        f"- checkpoint: `{card['checkpoint']}` (step {card['step']})",
        f"- pairs: {card['pairs']}, data sha256 `{card['data_sha256'][:16]}…`",
        f"- tformer {card['tformer_version']}, commit `{card['git_commit']}`",
        f"- hardware: {card['hardware']['processor']}, {card['hardware']['cpu_count']} threads, "
        f"torch {card['hardware']['torch']}",
        f"- wall time {card['wall_time_s']} s, {card['new_tokens_per_s']:,.0f} new tokens/s",
        f"- date: {card['date']}",
        "",
        "```json",
        json.dumps(
            {"model": card["model"], "train": card["train"], "decoding": card["decoding"]}, indent=2
        ),
        "```",
    ]
    return "\n".join(lines) + "\n"


CARD_FILES = ("hypotheses.txt", "result.json", "result.md")


def _earlier_card(folder: Path) -> set[str] | None:
    """The files of an earlier evaluation in ``folder`` (its result.json a card of tformer's),
    or None when ``folder`` holds none."""
    text = read_small_text(folder / "result.json", limit=1 << 26)
    try:
        card = json_loads(text) if text is not None else None
    except json.JSONDecodeError:
        return None
    if not isinstance(card, dict) or not {"tformer_version", "checkpoint"} <= set(card):
        return None
    return {name for name in CARD_FILES if (folder / name).is_file()}


# evaluate's output folder: written whole (a staged sibling renamed into place) and replaced
# when it holds an earlier evaluation and nothing else, as every re-run of evaluate does.
EVALUATION = MarkedFolder(
    marker="result.json",
    format="tformer-evaluation",
    version=1,
    noun="evaluation",
    command="`tformer evaluate`",
    option="--out",
    recognise=_earlier_card,
    unmarked="no result.json card of an earlier evaluation",
)


def check_card_folder(out: Path) -> None:
    """Refuse, before any work, an ``out`` that evaluate's card may not be written as.

    Raises:
        ConfigError: ``out`` is not a folder, or holds what no evaluation wrote.
    """
    EVALUATION.check_out(out)
    EVALUATION.check_replace(out, overwrite=True)


def write_card(out: Path, files: dict[str, str]) -> dict[str, Path]:
    """Write ``files`` (name -> text) as the folder ``out``, whole or not at all, replacing an
    earlier evaluation there (never a folder of anyone else's).

    Raises:
        ConfigError: ``out`` holds what no evaluation wrote, or another process writes it.
        CheckpointError: the folder cannot be written.
    """
    check_card_folder(out)
    with EVALUATION.staging(out, overwrite=True) as tmp:
        for name, text in files.items():
            (tmp / name).write_text(text, encoding="utf-8")
    return {name: out / name for name in files}


def write_results(out: Path, card: dict[str, Any], hypotheses: Sequence[str]) -> dict[str, Path]:
    """Write hypotheses.txt, result.json and result.md as the folder ``out``."""
    paths = write_card(
        out,
        {
            "hypotheses.txt": "".join(h + "\n" for h in hypotheses),
            "result.json": json.dumps(card, indent=2, ensure_ascii=False) + "\n",
            "result.md": card_markdown(card),
        },
    )
    return {
        "hypotheses": paths["hypotheses.txt"],
        "json": paths["result.json"],
        "markdown": paths["result.md"],
    }


def language_card(
    ckpt: Checkpoint,
    result: LanguageEvaluation,
    *,
    data: str | None,
    docs: Sequence[str],
    mask_heads: list[str] | None = None,
) -> dict[str, Any]:
    """The result card of a language model on one split (no outputs: it is measured on the
    text itself)."""
    digest = hashlib.sha256("".join(doc + "\n" for doc in docs).encode("utf-8")).hexdigest()
    return {
        "tformer_version": __version__,
        "git_commit": git_commit(),
        "checkpoint": str(ckpt.path),
        "step": ckpt.step,
        "arch": ckpt.model_config.arch,
        "data": data or "bundled text (data/text/)",
        "split": result.split,
        "documents": result.documents,
        "data_sha256": digest,
        "metrics": result.to_dict(),
        "mask_heads": mask_heads or [],
        "model": ckpt.model_config.to_dict(),
        "train": ckpt.train_config.to_dict(),
        "hardware": hardware(),
        "wall_time_s": result.wall_time,
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }


def write_language_results(out: Path, card: dict[str, Any]) -> dict[str, Path]:
    """Write result.json and result.md of a language model's card into ``out`` (atomically)."""
    rows = [
        f"| {name.replace('_', ' ')} | "
        f"{perplexity_text(value) if name == 'perplexity' else value} |"
        for name, value in card["metrics"].items()
    ]
    markdown = "\n".join(
        [
            f"# tformer evaluation ({card['arch']}): {card['data']} [{card['split']}]",
            "",
            "| metric | value |",
            "|---|---:|",
            *rows,
            "",
            f"- checkpoint: `{card['checkpoint']}` (step {card['step']})",
            f"- documents: {card['documents']}, data sha256 `{card['data_sha256'][:16]}…`",
            f"- tformer {card['tformer_version']}, commit `{card['git_commit']}`",
            f"- date: {card['date']}",
        ]
    )
    paths = write_card(
        out,
        {
            "result.json": json.dumps(card, indent=2, ensure_ascii=False) + "\n",
            "result.md": markdown + "\n",
        },
    )
    return {"json": paths["result.json"], "markdown": paths["result.md"]}
