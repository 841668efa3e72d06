"""What a run builds before its first step: the data, tokenizers, model config and model.

The checkpoint continued from (``--resume`` or ``--init-from``) is loaded first, because a
stream (``--streaming``) is tokenised with its tokenizers; then the data (a prepared folder,
a stream prepared into the id cache, or text), the tokenizers (the folder's, the checkpoint's,
given or trained), the splits as ids and the model, with the CPU speed-ups swapped in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from tformer import checkpoint as ckpt
from tformer.config import MASK, ModelConfig
from tformer.data.pairs import EncodedSplit
from tformer.errors import ConfigError
from tformer.fast.accelerate import accelerate
from tformer.model import TransformerBase, build_model, model_class
from tformer.training.configs import architecture, check_architecture
from tformer.training.distributed import World
from tformer.training.init_from import load_start, provenance
from tformer.training.inputs import (
    check_mask_token,
    check_same_tokenizer,
    encode_splits,
    lm_splits,
    load_data,
    prepared_splits,
    prepared_tokenizers,
    run_tokenizers,
    sized_for,
)
from tformer.training.launch import Job, RunOptions
from tformer.training.precision import Precision, resolve_precision
from tformer.training.reporting import Reporter
from tformer.training.resuming import check_data, load_for_resume


@dataclass
class Setup:
    """What ``_run`` builds before the loop starts."""

    model: TransformerBase
    model_config: ModelConfig
    tokenizers: ckpt.Tokenizers
    splits: dict[str, EncodedSplit]
    precision: Precision
    resumed: ckpt.Checkpoint | None
    data: dict[str, Any]  # the fingerprint of the training data, saved with each checkpoint
    data_note: str | None = None  # how the data changed since the resumed checkpoint
    init_from: dict[str, Any] | None = None  # fine-tuning: the checkpoint it started from


def set_up(
    job: Job, options: RunOptions, world: World, device: torch.device, report: Reporter
) -> Setup:
    """Data, tokenizers, the full model config and the model (the resumed one when resuming,
    the checkpoint's when fine-tuning)."""
    cfg, model_config = job.train, job.model
    resumed: ckpt.Checkpoint | None = None
    start: ckpt.Checkpoint | None = None
    if job.resume_from is not None:
        resumed = load_for_resume(job.out, job.resume_from)
        if model_config is not None:
            check_architecture(resumed.model_config, architecture(model_config))
        if options.tokenizer is not None:
            check_same_tokenizer(options.tokenizer, resumed)
    elif job.init_from is not None:
        start = load_start(job.init_from, model_config=model_config, tokenizer=options.tokenizer)
    base = resumed or start  # the checkpoint whose weights the run continues from
    if base is None and model_config is None:
        raise ConfigError("a model configuration is needed unless resuming or fine-tuning")
    wanted = base.model_config if base else model_config
    assert wanted is not None
    family = model_class(wanted.arch)
    data = load_data(
        cfg, options, job.tokenizer, base, wanted.max_len, report.tokenising, wanted.arch
    )
    data_note = None
    if resumed is not None:
        data_note = check_data(resumed.path, data.fingerprint, allow=options.allow_data_change)
    if data.prepared is not None:
        option = "--resume" if resumed else "--init-from"
        tokenizers = prepared_tokenizers(
            data.prepared, given=options.tokenizer, base=base, option=option
        )
    elif base is not None:
        tokenizers = base.tokenizers
    else:
        assert data.texts is not None
        specials = (MASK,) if family.fills_masks else ()
        tokenizers = run_tokenizers(
            job.tokenizer, options.tokenizer, world, device, data.texts, specials
        )
    if family.fills_masks:
        check_mask_token(tokenizers.source, options.tokenizer)
    model_config = base.model_config if base else sized_for(wanted, tokenizers)
    precision = resolve_precision(cfg.precision, device, model_config)
    if not family.reads_source:
        assert data.texts is not None
        splits = lm_splits(
            data.texts,
            tokenizers.source,
            model_config,
            pack=cfg.pack,
            data=cfg.data,
            block_size=cfg.block_size,
        )
    elif data.prepared is not None:
        splits = prepared_splits(data.prepared, model_config.max_len, strict=options.strict)
    else:
        assert data.texts is not None
        splits = encode_splits(
            data.texts,
            tokenizers,
            model_config.max_len,
            cfg.data,
            strict=options.strict,
            cache_dir=options.tokenized_cache,
            num_proc=options.num_proc,
            known={k: (v["pairs"], v["sha256"]) for k, v in data.fingerprint["splits"].items()},
            progress=report.tokenising,
        )
    # The speed-ups change no parameter and no result (tformer.fast), so every run has them.
    model = accelerate(base.model if base else build_model(model_config))
    return Setup(
        model, model_config, tokenizers, splits, precision, resumed, data.fingerprint, data_note,
        init_from=provenance(start) if start else None,
    )
