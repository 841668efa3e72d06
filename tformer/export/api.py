"""``export_checkpoint``: the checks, then one target's writer inside an atomic staging folder.

Order: the options (target, quantization), the checkpoint (found and loaded, every file
checked against its manifest), the output folder, the optional package, the architecture
against what the target can express. Only then is anything written, into a temporary sibling
of OUT renamed into place at the end, so a refusal or a failure leaves nothing behind.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from tformer.checkpoint.files import WEIGHTS, read_manifest
from tformer.checkpoint.run_dir import resolve
from tformer.checkpoint.store import Checkpoint, load_checkpoint
from tformer.config import ModelConfig, flag
from tformer.errors import ConfigError
from tformer.export.ctranslate2 import export_ctranslate2
from tformer.export.folder import MARKER, check_out, marker_text, staging, written_files
from tformer.export.huggingface import (
    MARIAN,
    check_marian,
    check_target,
    export_huggingface,
    target,
)
from tformer.model import model_class
from tformer.paths import excerpt
from tformer.version import __version__

TARGETS = ("ctranslate2", "huggingface")
QUANTIZATIONS = ("int8", "int8_float32", "float16")
INSTALL = 'pip install "tformer[export]"'
# The package each target needs, imported only when that target is asked for.
_PACKAGES = {"ctranslate2": "ctranslate2", "huggingface": "transformers"}


def check_options(to: str, quantization: str | None) -> None:
    """Refuse an unknown target or quantization, or a quantization the target lacks.

    Raises:
        ConfigError: naming the flag, the value and the choices.
    """
    if to not in TARGETS:
        raise ConfigError(f"--to {excerpt(to)} is not a target; choose one of {', '.join(TARGETS)}")
    if quantization is None:
        return
    if to != "ctranslate2":
        raise ConfigError(
            f"--quantization {excerpt(quantization)} applies only to --to ctranslate2; "
            f"leave it out for --to {to}"
        )
    if quantization not in QUANTIZATIONS:
        raise ConfigError(
            f"--quantization {excerpt(quantization)} is not supported; choose one of "
            f"{', '.join(QUANTIZATIONS)} (or leave it out for float32)"
        )


def require(to: str) -> None:
    """Import the package ``to`` needs, or say in one line how to install it.

    Raises:
        ConfigError: the package is not installed.
    """
    package = _PACKAGES[to]
    try:
        importlib.import_module(package)
    except ImportError as error:
        raise ConfigError(
            f"--to {to} needs the {package} package, which is not installed; {INSTALL}"
        ) from error


def variant_flags(config: ModelConfig) -> list[str]:
    """The architecture variants ``config`` uses, as their flags (``--positions rope``)."""
    found = []
    if config.positions != "sinusoidal":
        found.append(f"--positions {config.positions}")
    if config.n_kv_heads != config.n_heads:
        found.append(f"--kv-heads {config.n_kv_heads}")
    if config.gated:
        found.append(f"--activation {config.activation}")
    if config.normalization != "layernorm":
        found.append(f"--normalization {config.normalization}")
    return found + [f for f in unexported_flags(config) if f not in found]


def unexported_flags(config: ModelConfig) -> list[str]:
    """The variants of GPT-2, BERT and T5 ``config`` uses, which neither export writes."""
    tanh = ("gelu_tanh", "geglu_tanh")
    found = [f"--activation {config.activation}"] if config.activation in tanh else []
    if not config.embedding_scale:
        found.append("--no-embedding-scale")
    found += [
        flag(name) for name in ("embedding_norm", "segment_embedding") if getattr(config, name)
    ]
    if config.norm_eps is not None:
        found.append(f"--norm-eps {config.norm_eps}")
    unset = ("attention_scale", "linear_bias")
    found += [flag("no_" + name) for name in unset if not getattr(config, name)]
    if config.output_scale:
        found.append(flag("output_scale"))
    return found


def check_variants(config: ModelConfig, to: str) -> None:
    """Refuse the architecture variants an export cannot express.

    Marian (--to huggingface) has sinusoidal positions, multi-head attention, ungated
    feed-forward layers and LayerNorm only. CTranslate2's encoder-decoder spec takes learned
    positions (a table added to the embeddings), gated feed-forward layers, RMSNorm and one
    key/value head (multi-query), each held to tformer's scores by a parity test; it has no
    rotary positions and no 1 < K < heads for encoder-decoders.

    With --to huggingface, a decoder-only, encoder-only or T5-layout (relative positions)
    checkpoint goes to its own transformers model, which names what it cannot express
    (``tformer.export.huggingface.check_target``).

    Raises:
        ConfigError: naming each variant the checkpoint uses that the target cannot express.
    """
    if to == "huggingface" and target(config) is not MARIAN:
        check_target(config)
        return
    if not model_class(config.arch).reads_source:
        raise ConfigError(
            f"--to {to} exports an encoder-decoder (translation) model; this checkpoint is a "
            f"--arch {config.arch} model, which tformer export does not write"
        )
    found = variant_flags(config)
    if to == "ctranslate2":
        found = [
            f
            for f in found
            if f.startswith(("--positions rope", "--positions relative"))
            or (f.startswith("--kv-heads") and config.n_kv_heads != 1)
        ] + unexported_flags(config)
    if not found:
        return
    why = (
        "Marian has only sinusoidal positions, multi-head attention, relu/gelu feed-forward "
        "layers and LayerNorm"
        if to == "huggingface"
        else "CTranslate2's encoder-decoder has no rotary or relative positions, of grouped "
        "key/value heads only one (--kv-heads 1), and the paper's embeddings"
    )
    raise ConfigError(
        f"--to {to}: the checkpoint was trained with {', '.join(found)}, which the export "
        f"cannot express ({why}); use tformer's own decoding for it"
    )


def export_checkpoint(
    checkpoint: str | Path,
    out: str | Path,
    *,
    to: str,
    quantization: str | None = None,
    overwrite: bool = False,
) -> Path:
    """Export a checkpoint (or a run folder's latest) to a CTranslate2 or Hugging Face folder.

    Args:
        checkpoint: a checkpoint folder, or a run folder (its latest checkpoint is used).
        out: the folder to create; it must be absent or empty, or (with ``overwrite``) a
            folder an earlier export wrote and nothing else touched.
        to: "ctranslate2" or "huggingface".
        quantization: CTranslate2 only: "int8", "int8_float32" or "float16" weights
            (None: float32).
        overwrite: replace an earlier export in ``out``.

    Returns:
        The export folder.

    Raises:
        ConfigError: a bad option, an OUT that may not be written, a missing package, or an
            architecture the target cannot express (exit 2).
        CheckpointError: not a checkpoint, or a checkpoint that fails its checks (exit 4).
    """
    check_options(to, quantization)
    folder = resolve(checkpoint)
    out = Path(out).expanduser()
    check_out(out, overwrite=overwrite, checkpoint=folder)
    require(to)
    loaded = load_checkpoint(folder)
    check_variants(loaded.model_config, to)
    if to == "huggingface" and target(loaded.model_config) is MARIAN:
        check_marian(loaded.model_config)
    with staging(out, overwrite=overwrite) as tmp:
        _write(loaded, tmp, to, quantization)
        written = written_files(tmp)
        (tmp / MARKER).write_text(
            marker_text(
                written,
                target=to,
                quantization=quantization or ("float32" if to == "ctranslate2" else None),
                checkpoint=str(loaded.path.absolute()),
                checkpoint_step=loaded.step,
                checkpoint_weights_sha256=read_manifest(loaded.path)[WEIGHTS]["sha256"],
                tformer_version=__version__,
            ),
            encoding="utf-8",
        )
    return out


def _write(checkpoint: Checkpoint, folder: Path, to: str, quantization: str | None) -> None:
    if to == "ctranslate2":
        export_ctranslate2(checkpoint, folder, quantization)
    else:
        export_huggingface(checkpoint, folder)
