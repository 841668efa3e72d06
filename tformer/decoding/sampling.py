"""Autoregressive decoding: the settings, the cached decoder step, greedy and sampling loops.

Shape legend: B source rows, R rows being decoded (sources x samples or beams), t tokens
generated so far, V target vocabulary, S source length.

Each step turns the decoder's logits into the next token through the logit processors of
``tformer.decoding.logits``, in the order documented there (constraints: repetition penalty, no-repeat
n-gram, min new tokens; then, when sampling: temperature, top-k, top-p, min-p). Beam search
lives in ``tformer.decoding.beam`` and shares the settings, the step and the constraints.

Per-token log-probabilities reported in a ``Hypothesis`` are the *model's* (softmax of the raw
logits, <pad>/<bos> excluded), so they compare across decoding settings.

Sampling is reproducible per input: the random number that picks row r's token at step t is a
hash of (seed, the source's token ids, the sample index, t), so the same input with the same
seed gives the same samples whatever else is in the batch, the batch size, or the device.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from tformer.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from tformer.decoding.logits import (
    Stage,
    apply_temperature,
    constraint_stages,
    mask_special_tokens,
    min_p_filter,
    process_logits,
    run_stages,
    sampling_stages,
    top_k_filter,
    top_p_filter,
)
from tformer.errors import ConfigError
from tformer.model import Transformer
from tformer.model.transformer import EncoderOutput

__all__ = [
    "DecodingConfig",
    "Hypothesis",
    "StepExplanation",
    "apply_temperature",
    "decode",
    "decode_texts",
    "explain",
    "make_generator",
    "make_stepper",
    "min_p_filter",
    "process_logits",
    "sample_from_logits",
    "stream_tokens",
    "top_k_filter",
    "top_p_filter",
]

# -- settings ---------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class DecodingConfig:
    """How to pick each next token. Field ``foo_bar`` is the CLI flag ``--foo-bar``.

    temperature 0 and beam_size 1 is greedy; temperature > 0 samples (``num_samples`` outputs
    per input); beam_size > 1 is beam search (``n_best`` outputs per input, ranked by
    sum log p / length ** length_penalty, length counting the <eos> token when there is one).
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    no_repeat_ngram_size: int = 0
    beam_size: int = 1
    length_penalty: float = 1.0
    n_best: int = 1
    min_new_tokens: int = 0
    max_new_tokens: int = 128
    num_samples: int = 1
    seed: int | None = None
    # False re-runs the decoder over the whole prefix at every step: slower, same results;
    # the reference that tests and benchmarks hold the key/value cache against.
    use_cache: bool = True

    def __post_init__(self) -> None:
        self._check_ranges()
        self._check_combinations()

    def _check_ranges(self) -> None:
        checks = [
            (self.temperature >= 0, f"--temperature {self.temperature} must be >= 0 (0 = greedy)"),
            (self.top_k >= 0, f"--top-k {self.top_k} must be >= 0 (0 = off)"),
            (0.0 < self.top_p <= 1.0, f"--top-p {self.top_p} must be in (0, 1] (1 = off)"),
            (0.0 <= self.min_p <= 1.0, f"--min-p {self.min_p} must be in [0, 1] (0 = off)"),
            (
                self.repetition_penalty > 0,
                f"--repetition-penalty {self.repetition_penalty} must be > 0 (1 = off)",
            ),
            (
                self.no_repeat_ngram_size >= 0,
                f"--no-repeat-ngram-size {self.no_repeat_ngram_size} must be >= 0 (0 = off)",
            ),
            (self.beam_size >= 1, f"--beam-size {self.beam_size} must be >= 1 (1 = no beam)"),
            (self.n_best >= 1, f"--n-best {self.n_best} must be >= 1"),
            (self.min_new_tokens >= 0, f"--min-new-tokens {self.min_new_tokens} must be >= 0"),
            (self.max_new_tokens >= 1, f"--max-new-tokens {self.max_new_tokens} must be >= 1"),
            (self.num_samples >= 1, f"--num-samples {self.num_samples} must be >= 1"),
        ]
        for ok, message in checks:
            if not ok:
                raise ConfigError(message)

    def _check_combinations(self) -> None:
        if self.min_new_tokens > self.max_new_tokens:
            raise ConfigError(
                f"--min-new-tokens {self.min_new_tokens} exceeds --max-new-tokens "
                f"{self.max_new_tokens}; raise --max-new-tokens or lower --min-new-tokens"
            )
        if self.n_best > self.beam_size:
            raise ConfigError(
                f"--n-best {self.n_best} exceeds --beam-size {self.beam_size}: beam search keeps "
                f"only beam-size hypotheses; use --beam-size {self.n_best} or more"
            )
        sampling_flags = self._sampling_flags()
        if self.beam_size > 1:
            if self.num_samples > 1:
                raise ConfigError(
                    f"--num-samples {self.num_samples} does not apply to beam search "
                    f"(--beam-size {self.beam_size}); use --n-best {self.num_samples} for "
                    "several outputs, or --beam-size 1 to sample"
                )
            if sampling_flags:
                raise ConfigError(
                    f"{', '.join(sampling_flags)} with --beam-size {self.beam_size}: beam search "
                    "does not sample; drop them, or use --beam-size 1 to sample"
                )
            return
        if self.length_penalty != 1.0:
            raise ConfigError(
                f"--length-penalty {self.length_penalty} only applies to beam search; "
                "add --beam-size, e.g. --beam-size 4"
            )
        if self.temperature == 0:
            if self.num_samples > 1:
                raise ConfigError(
                    f"--num-samples {self.num_samples} needs sampling: with --temperature 0 "
                    "(greedy) every sample would be the same; set --temperature, e.g. 0.8"
                )
            filters = [f for f in sampling_flags if not f.startswith("--temperature")]
            if filters:
                raise ConfigError(
                    f"{', '.join(filters)} only apply when sampling, and --temperature 0 is "
                    "greedy; set --temperature, e.g. 1.0"
                )

    def _sampling_flags(self) -> list[str]:
        flags = []
        if self.temperature > 0:
            flags.append(f"--temperature {self.temperature:g}")
        if self.top_k > 0:
            flags.append(f"--top-k {self.top_k}")
        if self.top_p < 1.0:
            flags.append(f"--top-p {self.top_p:g}")
        if self.min_p > 0:
            flags.append(f"--min-p {self.min_p:g}")
        return flags

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 and self.beam_size == 1

    @property
    def outputs_per_input(self) -> int:
        return self.n_best if self.beam_size > 1 else self.num_samples

    def constraints(self) -> list[Stage]:
        """Processor stages 1-3 (every strategy)."""
        return constraint_stages(
            repetition_penalty=self.repetition_penalty,
            no_repeat_ngram_size=self.no_repeat_ngram_size,
            min_new_tokens=self.min_new_tokens,
        )

    def sampling(self) -> list[Stage]:
        """Processor stages 4-7 (sampling only; empty when greedy or beam search)."""
        if self.temperature == 0:
            return []
        return sampling_stages(
            temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, min_p=self.min_p
        )


@dataclass
class Hypothesis:
    """One decoded sequence.

    Attributes:
        ids: output token ids, without <bos> / <eos>.
        token_logprobs: the model's log-probability of each generated token (the <eos> too,
            when ``finished``).
        finished: the model ended it with <eos> (False: cut off by --max-new-tokens).
        beam_score: what beam search ranked it by, sum log p / length ** length_penalty
            (None outside beam search).
    """

    ids: list[int]
    token_logprobs: list[float]
    finished: bool
    beam_score: float | None = None

    @property
    def logprob(self) -> float:
        """The model's log-probability of the whole output (<eos> included when finished)."""
        return float(sum(self.token_logprobs))

    @property
    def score(self) -> float:
        """What the strategy ranks by: ``beam_score`` for beam search, else ``logprob``."""
        return self.logprob if self.beam_score is None else self.beam_score


# -- one decoder step, with or without the cache ----------------------------------------------


def select_rows(encoded: EncoderOutput, index: Tensor) -> EncoderOutput:
    return EncoderOutput(encoded.memory.index_select(0, index), encoded.mask.index_select(0, index))


class CachedStepper:
    """Feeds one new token per row; everything earlier comes from the key/value cache.

    The source is encoded once by the caller; the cross-attention keys/values are projected
    on the first step and kept; each layer's self-attention keys/values grow by one a step.
    """

    def __init__(self, model: Transformer, encoded: EncoderOutput) -> None:
        self.model = model
        self.encoded = encoded
        self.cache = model.new_cache()

    def step(self, tokens: Tensor) -> Tensor:
        """(R,) newest tokens -> (R, V) float32 logits for the next one."""
        out = self.model.decode(tokens[:, None], self.encoded, cache=self.cache)
        return out.logits[:, -1].float()

    def reorder(self, index: Tensor, *, same_source: bool = False) -> None:
        """Keep rows ``index`` in that order (beams reordered, finished rows dropped).

        ``same_source``: every row ``index[i]`` decodes the same source as row ``i`` (beams
        reshuffled inside their source), so the source-side tensors stay as they are and
        only the self-attention caches move.
        """
        if same_source:
            for layer in self.cache.layers:
                layer.self_attn.reorder(index)
            return
        self.cache.reorder(index)
        self.encoded = select_rows(self.encoded, index)


class RecomputeStepper:
    """The cache-free reference: re-runs the decoder over the whole prefix at every step."""

    def __init__(self, model: Transformer, encoded: EncoderOutput) -> None:
        self.model = model
        self.encoded = encoded
        self.prefix: Tensor | None = None  # (R, t + 1) with <bos>

    def step(self, tokens: Tensor) -> Tensor:
        new = tokens[:, None]
        self.prefix = new if self.prefix is None else torch.cat([self.prefix, new], dim=1)
        return self.model.decode(self.prefix, self.encoded).logits[:, -1].float()

    def reorder(self, index: Tensor, *, same_source: bool = False) -> None:
        assert self.prefix is not None
        self.prefix = self.prefix.index_select(0, index)
        if not same_source:
            self.encoded = select_rows(self.encoded, index)


Stepper = CachedStepper | RecomputeStepper


def make_stepper(model: Transformer, src: Tensor, use_cache: bool = True) -> Stepper:
    """Encode ``src`` (B, S) once and return the object that runs decoder steps over it."""
    encoded = model.encode(src)
    return CachedStepper(model, encoded) if use_cache else RecomputeStepper(model, encoded)


def step_limit(model: Transformer, config: DecodingConfig) -> int:
    """Decoder steps at most: --max-new-tokens (the <eos> counts), within the model's positions."""
    return min(config.max_new_tokens, model.config.max_len)


# -- reproducible randomness ------------------------------------------------------------------


def _hash64(*parts: int) -> int:
    data = struct.pack(f"<{len(parts)}Q", *(p % 2**64 for p in parts))
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def row_key(src_ids: Sequence[int], sample: int) -> int:
    """A stable 64-bit name for (source, sample index): the input's own random stream."""
    return _hash64(*src_ids, len(src_ids), sample)


def uniform(seed: int, key: int, step: int) -> float:
    """A uniform number in [0, 1) that depends only on (seed, key, step), 53 random bits."""
    return (_hash64(seed, key, step) >> 11) * 2.0**-53


def sample_from_logits(logits: Tensor, uniforms: Tensor) -> Tensor:
    """Inverse-CDF sampling from softmax(logits): row i takes the first token whose
    cumulative probability exceeds ``uniforms[i]``. Tokens at -inf are never chosen.

    Args:
        logits: (R, V) processed scores. uniforms: (R,) numbers in [0, 1).
    Returns:
        (R,) token ids.
    """
    device = logits.device
    if device.type == "mps":  # no float64 there
        logits = logits.cpu()
    cdf = logits.double().softmax(dim=-1).cumsum(dim=-1)  # float64: no drift over 50k tokens
    target = uniforms.to(cdf)[:, None] * cdf[:, -1:]
    tokens = torch.searchsorted(cdf, target, right=True)[:, 0].clamp(max=logits.size(-1) - 1)
    return tokens.to(device)


def make_generator(seed: int | None, device: torch.device | str = "cpu") -> torch.Generator | None:
    """A torch generator seeded with ``seed``; None (torch's global one) when no seed."""
    if seed is None:
        return None
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    return generator


def resolve_seed(seed: int | None) -> int:
    """The given seed, or a fresh one from torch's global generator."""
    if seed is not None:
        return seed
    return int(torch.randint(0, 2**62, ()).item())


# -- greedy and sampling ----------------------------------------------------------------------

# Each step yields the rows that got a token and those tokens (<eos> included); the
# generator's return value is one list of hypotheses per source row.
StepEvents = Generator[tuple[list[int], list[int]], None, list[list[Hypothesis]]]


def _source_rows(src: Tensor) -> list[list[int]]:
    return [[t for t in row if t != PAD_ID] for row in src.tolist()]


@torch.inference_mode()  # lighter than no_grad: no version counters
def sample_steps(
    model: Transformer, src: Tensor, config: DecodingConfig, samples: Sequence[int] | None = None
) -> StepEvents:
    """Greedy / sampling decoding of a padded (B, S) batch, step by step (see ``decode``).

    Rows are sources x samples; the first step runs once per source and is then copied to its
    samples; a row that produced <eos> leaves the batch. Yielded row numbers count
    source x len(samples) + sample position.

    Args:
        samples: which sample indices to decode (default: all ``config.num_samples``).
    """
    model.eval()
    device = src.device
    samples = range(config.num_samples) if samples is None else samples
    n_src, n = src.size(0), len(samples)
    seed = resolve_seed(config.seed)
    keys = [row_key(ids, s) for ids in _source_rows(src) for s in samples]
    constraints, warpers = config.constraints(), config.sampling()
    stepper = make_stepper(model, src, config.use_cache)

    active = list(range(n_src * n))  # the hypothesis (source x sample) of each live row
    history = torch.empty(n_src, 0, dtype=torch.long, device=device)  # (R, t)
    last = torch.full((n_src,), BOS_ID, dtype=torch.long, device=device)
    ids: list[list[int]] = [[] for _ in active]
    logps: list[list[float]] = [[] for _ in active]
    finished = [False] * len(active)
    limit = step_limit(model, config)

    for step in range(limit):
        logits = mask_special_tokens(stepper.step(last), inplace=True)  # (R, V)
        if step == 0 and n > 1:  # one step per source so far: copy it to the samples
            expand = torch.arange(n_src, device=device).repeat_interleave(n)
            logits, history = logits.index_select(0, expand), history.index_select(0, expand)
            stepper.reorder(expand)
        model_logp = logits.log_softmax(dim=-1)
        scores = run_stages(logits, history, constraints)
        if warpers:
            scores = run_stages(scores, history, warpers)
            u = torch.tensor([uniform(seed, keys[h], step) for h in active], dtype=torch.float64)
            chosen = sample_from_logits(scores, u)
        else:
            # max(dim) gives the same first-maximum index as argmax, about 3x faster on a CPU
            chosen = scores.max(dim=-1).indices
        chosen_logp = model_logp.gather(1, chosen[:, None])[:, 0]

        tokens = chosen.tolist()
        keep: list[int] = []
        for row, (h, token, logp) in enumerate(
            zip(active, tokens, chosen_logp.tolist(), strict=True)
        ):
            logps[h].append(logp)
            if token == EOS_ID:
                finished[h] = True
            else:
                ids[h].append(token)
                keep.append(row)
        yield active, tokens
        if not keep or step == limit - 1:
            break
        history = torch.cat([history, chosen[:, None]], dim=1)
        if len(keep) < len(active):  # finished rows stop costing compute
            index = torch.tensor(keep, device=device)
            active = [active[row] for row in keep]
            chosen, history = chosen.index_select(0, index), history.index_select(0, index)
            stepper.reorder(index)
        last = chosen

    hyps = [Hypothesis(ids[h], logps[h], finished[h]) for h in range(len(ids))]
    return [hyps[i * n : (i + 1) * n] for i in range(n_src)]


def _drain(events: StepEvents) -> list[list[Hypothesis]]:
    while True:
        try:
            next(events)
        except StopIteration as stop:
            return stop.value


def decode(model: Transformer, src: Tensor, config: DecodingConfig) -> list[list[Hypothesis]]:
    """Decode a padded (B, S) batch of source ids.

    Returns:
        For each source row, in row order: ``num_samples`` hypotheses (greedy / sampling), or
        the ``n_best`` best of beam search, best first.
    """
    if config.beam_size > 1:
        from tformer.decoding.beam import beam_search  # beam imports this module

        return beam_search(model, src, config)
    return _drain(sample_steps(model, src, config))


def stream_tokens(
    model: Transformer, src_ids: Sequence[int], config: DecodingConfig, sample: int = 0
) -> Iterator[int]:
    """Yield the output tokens of one source as they are decoded (greedy or sampling).

    Gives the same tokens as ``decode_texts`` with the same settings (sample ``sample``).
    """
    if config.beam_size > 1:
        raise ConfigError(
            "streaming needs greedy decoding or sampling: beam search knows its best output "
            "only at the end; drop --stream or --beam-size"
        )
    if not 0 <= sample < config.num_samples:
        raise ValueError(f"sample {sample} is outside 0..{config.num_samples - 1}")
    device = next(model.parameters()).device
    src = torch.tensor([list(src_ids) or [EOS_ID]], device=device)
    for _, tokens in sample_steps(model, src, config, samples=[sample]):
        if tokens[0] == EOS_ID:
            return
        yield tokens[0]


def decode_texts(
    model: Transformer,
    src_ids: Sequence[Sequence[int]],
    config: DecodingConfig,
    *,
    batch_size: int = 64,
) -> list[list[Hypothesis]]:
    """Decode many sources: sorted by length into batches, results back in input order.

    Args:
        batch_size: rows decoded together (each source takes num_samples or beam_size rows).
    Returns:
        For each source, ``config.num_samples`` hypotheses, or the ``n_best`` of beam search.
    """
    from tformer.data.pairs import pad  # local: data imports HF datasets lazily, keep this light

    device = next(model.parameters()).device
    width = config.beam_size if config.beam_size > 1 else config.num_samples
    sources_per_batch = max(1, batch_size // width)
    order = sorted(range(len(src_ids)), key=lambda i: len(src_ids[i]))
    results: list[list[Hypothesis]] = [[] for _ in src_ids]
    for start in range(0, len(order), sources_per_batch):
        chunk = order[start : start + sources_per_batch]
        # Empty inputs still need one position for the encoder to attend to.
        rows = [list(src_ids[i]) or [EOS_ID] for i in chunk]
        for index, hyps in zip(chunk, decode(model, pad(rows).to(device), config), strict=True):
            results[index] = hyps
    return results


# -- a look inside each choice ----------------------------------------------------------------


@dataclass
class StepExplanation:
    """Why one output token was chosen.

    Attributes:
        token: the token chosen at this step (<eos> for the last step of a finished output).
        probs: its probability after each processor stage, in pipeline order, starting with
            ``"model"`` (softmax of the raw logits).
        alternatives: the most probable tokens of the final distribution, (id, probability).
        source: the source positions the last decoder layer's cross-attention weighted most
            (mean over heads), (position, weight).
    """

    token: int
    probs: dict[str, float]
    alternatives: list[tuple[int, float]]
    source: list[tuple[int, float]]


@torch.no_grad()
def explain(
    model: Transformer,
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
    src = torch.tensor([list(src_ids) or [EOS_ID]], device=device)
    tgt_in = torch.tensor([[BOS_ID, *chosen[:-1]]], device=device)
    out = model.decode(tgt_in, model.encode(src), need_weights=True)
    assert out.cross_attentions is not None
    cross = out.cross_attentions[-1][0].float().mean(dim=0)  # (T, S)
    stages = config.constraints() + config.sampling()
    steps = []
    for t, token in enumerate(chosen):
        logits = mask_special_tokens(out.logits[:, t].float())  # (1, V)
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
