"""A look inside each choice of a decoded output: processor stages, alternatives, source.

One teacher-forced decoder pass over the output returns every step's logits and
cross-attention maps; the logit processors then run stage by stage on each step's logits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from tformer.checkpoint.store import Tokenizers
from tformer.config import BOS_ID, EOS_ID
from tformer.data.display import display_tokens
from tformer.decoding.api import fit_input, fit_source
from tformer.decoding.logits import mask_special_tokens
from tformer.decoding.settings import DecodingConfig, Hypothesis
from tformer.model import TransformerBase
from tformer.model.transformer import source_as_read


@dataclass
class StepExplanation:
    """Why one output token was chosen.

    Attributes:
        token: the token chosen at this step (<eos> for the last step of a finished output).
        probs: its probability after each processor stage, in pipeline order, starting with
            ``"model"`` (softmax of the raw logits).
        alternatives: the most probable tokens of the final distribution, (id, probability).
        source: the source positions the last decoder layer's cross-attention weighted most
            (mean over heads), (position, weight). For a decoder-only model: the positions of
            <bos> + prompt + output so far that the last layer's self-attention row which
            produced the token weighted most.
    """

    token: int
    probs: dict[str, float]
    alternatives: list[tuple[int, float]]
    source: list[tuple[int, float]]


@torch.no_grad()
def explain(
    model: TransformerBase,
    src_ids: Sequence[int],
    hyp: Hypothesis,
    config: DecodingConfig,
    *,
    top: int = 5,
    top_source: int = 3,
) -> list[StepExplanation]:
    """Replay ``hyp`` (decoded from ``src_ids`` with ``config``) one step at a time.

    One teacher-forced decoder pass over the output returns every step's logits and
    cross-attention maps; the processors then run stage by stage on each step's logits.
    """
    model.eval()
    device = next(model.parameters()).device
    chosen = [*hyp.ids, EOS_ID] if hyp.finished else list(hyp.ids)
    if not chosen:
        return []
    if model.continues_prompts:
        # The prompt is part of the decoder's input; each output step reads one row after it.
        prompt = fit_input(model, src_ids)
        tgt_in = torch.tensor([[BOS_ID, *prompt, *chosen[:-1]]], device=device)
        out = model.decode(tgt_in, model.encode(tgt_in), need_weights=True)
        assert out.self_attentions is not None
        offset = len(prompt)
        cross = out.self_attentions[-1][0].float().mean(dim=0)[offset:]  # (T, P + 1 + T)
        logits_at = out.logits[:, offset:]
        tgt_in = tgt_in[:, offset:]
    else:
        src = torch.tensor([fit_source(src_ids, model.config.max_len)], device=device)
        tgt_in = torch.tensor([[BOS_ID, *chosen[:-1]]], device=device)
        out = model.decode(tgt_in, model.encode(src), need_weights=True)
        assert out.cross_attentions is not None
        cross = out.cross_attentions[-1][0].float().mean(dim=0)  # (T, S)
        logits_at = out.logits
    stages = config.constraints() + config.sampling()
    steps = []
    for t, token in enumerate(chosen):
        logits = mask_special_tokens(logits_at[:, t].float())  # (1, V)
        history = tgt_in[:, 1 : t + 1]
        probs = {"model": float(logits.softmax(-1)[0, token])}
        for stage in stages:
            logits = stage.apply(logits, history)
            probs[stage.name] = float(logits.softmax(-1)[0, token])
        best = logits.softmax(-1)[0].topk(min(top, logits.size(-1)))
        attention = cross[t].topk(min(top_source, cross.size(-1)))
        steps.append(
            StepExplanation(
                token=token,
                probs=probs,
                alternatives=_pairs(best.indices, best.values),
                source=_pairs(attention.indices, attention.values),
            )
        )
    return steps


def _pairs(indices: Tensor, values: Tensor) -> list[tuple[int, float]]:
    return list(zip(indices.tolist(), values.tolist(), strict=True))


def attended_tokens(
    model: TransformerBase, tokenizers: Tokenizers, src_ids: Sequence[int], hyp: Hypothesis
) -> list[str]:
    """The tokens that each step's ``source`` positions index: the source as the encoder reads
    it (with the <eos> Marian's models add), or a decoder-only model's <bos> + prompt (as it
    is read) + output."""
    if model.continues_prompts:
        prompt = display_tokens(tokenizers.source, [BOS_ID, *fit_input(model, src_ids)])
        return [*prompt, *display_tokens(tokenizers.target, hyp.ids)]
    read = source_as_read(list(src_ids) or [EOS_ID], model.config)
    return display_tokens(tokenizers.source, read)
