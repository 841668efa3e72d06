"""Decoding settings and results: how to pick each next token, and what comes out.

Each step turns the decoder's logits into the next token through the logit processors of
``tformer.decoding.logits``, in the order documented there (constraints: repetition penalty,
no-repeat n-gram, min new tokens; then, when sampling: temperature, top-k, top-p, min-p).

Per-token log-probabilities reported in a ``Hypothesis`` are the *model's* (softmax of the raw
logits, <pad>/<bos> excluded), so they compare across decoding settings.
"""

from __future__ import annotations

from dataclasses import dataclass

from tformer.config import check_numbers
from tformer.decoding.logits import Stage, constraint_stages, sampling_stages
from tformer.errors import ConfigError

# The most rows decoded together: each input takes --beam-size or --num-samples rows, and
# --batch-size rows go through the model at once. Above it, memory and time grow past what any
# use needs (a typo like -n 100000000 would run for hours); the refusal names the flag to lower.
MAX_ROWS = 4096
# Past these, the arithmetic overflows: logits / T and z / θ reach inf (then NaN probabilities),
# length ** length_penalty overflows a float or reaches 0.
MIN_TEMPERATURE = 1e-4
PENALTY_RANGE = (1e-3, 1e3)
MAX_LENGTH_PENALTY = 10.0


def check_rows(option: str, value: int) -> None:
    """Refuse ``option`` (--beam-size, --num-samples, --batch-size) over ``MAX_ROWS``."""
    if value > MAX_ROWS:
        raise ConfigError(
            f"{option} {value} is over {MAX_ROWS}, the most rows decoded together; "
            f"lower {option}"
        )


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
        check_numbers(self)  # inf / nan and huge ints first: the checks below compare them
        self._check_ranges()
        self._check_combinations()

    def _check_ranges(self) -> None:
        checks = [
            (self.temperature >= 0, f"--temperature {self.temperature} must be >= 0 (0 = greedy)"),
            (
                self.temperature == 0 or self.temperature >= MIN_TEMPERATURE,
                f"--temperature {self.temperature} is below {MIN_TEMPERATURE}, too small to "
                "sample with (the scaled logits overflow); use 0 for greedy",
            ),
            (self.top_k >= 0, f"--top-k {self.top_k} must be >= 0 (0 = off)"),
            (0.0 < self.top_p <= 1.0, f"--top-p {self.top_p} must be in (0, 1] (1 = off)"),
            (0.0 <= self.min_p <= 1.0, f"--min-p {self.min_p} must be in [0, 1] (0 = off)"),
            (
                PENALTY_RANGE[0] <= self.repetition_penalty <= PENALTY_RANGE[1],
                f"--repetition-penalty {self.repetition_penalty} must be in "
                f"[{PENALTY_RANGE[0]}, {PENALTY_RANGE[1]}] (1 = off)",
            ),
            (
                abs(self.length_penalty) <= MAX_LENGTH_PENALTY,
                f"--length-penalty {self.length_penalty} must be in "
                f"[-{MAX_LENGTH_PENALTY}, {MAX_LENGTH_PENALTY}] (1 = mean log p per token)",
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
        check_rows("--beam-size", self.beam_size)
        check_rows("--num-samples", self.num_samples)

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

    @property
    def rows_per_input(self) -> int:
        """The decoder rows one input takes: its beams, or its samples."""
        return self.beam_size if self.beam_size > 1 else self.num_samples

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
