"""What the endpoints share: the loaded model, its worker, and the per-request checks."""

from __future__ import annotations

import dataclasses
import secrets
from collections.abc import Sequence
from typing import Any

from tformer.analysis.attention import attention_maps
from tformer.analysis.explain import attended_tokens, explain
from tformer.checkpoint.store import Checkpoint
from tformer.config import SEED_LIMIT, check_text
from tformer.data.tokenizer import Tokenizer
from tformer.decoding.api import long_inputs_warning, long_target_warning
from tformer.decoding.ensemble import Decodable, Ensemble
from tformer.decoding.settings import DecodingConfig, Hypothesis
from tformer.decoding.text import translate
from tformer.errors import ConfigError
from tformer.serve.answers import (
    attention_record,
    explain_record,
    logprob_of,
    model_record,
    output_record,
    settings_record,
)
from tformer.serve.batcher import Batcher
from tformer.serve.schemas import AttentionRequest, Decoding, ExplainRequest
from tformer.serve.settings import ServeSettings

LIBRARY_MAX_NEW_TOKENS = DecodingConfig().max_new_tokens


class Service:
    """One checkpoint served: requests checked here, decoded by the ``Batcher``'s worker.

    ``model``, an ensemble of ``loaded``'s model and others (``members`` names their
    checkpoints), decodes in its place when given; attention maps and explanations stay one
    model's, so they are refused then.
    """

    def __init__(
        self,
        loaded: Checkpoint,
        settings: ServeSettings,
        *,
        quantize: str,
        model: Decodable | None = None,
        members: Sequence[str] = (),
    ) -> None:
        self.loaded = loaded
        self.model = loaded.model if model is None else model
        self.settings = settings
        self.max_input_tokens = settings.max_input_tokens or self.model.config.max_len
        self.model_info = model_record(loaded, quantize)
        if isinstance(self.model, Ensemble) and len(self.model.members) > 1:
            self.model_info["ensemble"] = list(members)
        if isinstance(self.model, Ensemble) and self.model.shortlist is not None:
            self.model_info["shortlist"] = True  # decoded over a lexical shortlist
        self.batcher = Batcher(
            self.model,
            window_s=settings.batch_window_ms / 1000,
            max_batch_tokens=settings.max_batch_tokens,
            max_waiting=settings.max_queue,
        )

    # -- checks ---------------------------------------------------------------------------

    def decoding_config(self, request: Decoding) -> DecodingConfig:
        """The request's settings, checked by the library and against the server's caps.

        Sampling without a seed gets a fresh one (reported in the answer), so that requests
        never share a random stream; greedy and beam search drop the seed, which they do
        not use, so they batch whatever seed was sent.
        """
        cap = self.settings.max_new_tokens
        wanted = request.max_new_tokens
        if wanted is not None and wanted > cap:
            raise ConfigError(
                f"max_new_tokens {wanted} is over this server's cap of {cap} "
                "(tformer serve --max-new-tokens); ask for fewer"
            )
        config = request.decoding_config(
            max_new_tokens=min(LIBRARY_MAX_NEW_TOKENS, cap) if wanted is None else wanted,
            seed=request.seed,
        )
        if config.temperature == 0:
            return dataclasses.replace(config, seed=None)
        if config.seed is None:
            return dataclasses.replace(config, seed=secrets.randbelow(SEED_LIMIT + 1))
        return config

    def encode(self, texts: Sequence[str], field: str = "inputs") -> list[list[int]]:
        """Token ids of ``texts``, refusing too many inputs, text that is not Unicode, or an
        input too long. Runs in a thread: tokenising a long text takes the event loop's time.
        """
        if not texts:
            raise ConfigError(f"{field} is an empty list; give a text or a list of texts")
        if len(texts) > self.settings.max_inputs:
            raise ConfigError(
                f"{field} has {len(texts)} texts; this server takes at most "
                f"{self.settings.max_inputs} a request (tformer serve --max-inputs); "
                "split the request"
            )
        names = [f"{field}[{n}]" if len(texts) > 1 else field for n in range(len(texts))]
        for text, name in zip(texts, names, strict=True):
            check_text(text, name, ConfigError)
        ids = native_ids(self.loaded.tokenizers.source, list(texts))
        for row, name in zip(ids, names, strict=True):
            self.check_length(row, name)
        return ids

    def encode_target(self, text: str) -> list[int]:
        """Token ids of a teacher-forced ``target``, checked as ``encode`` checks inputs."""
        check_text(text, "target", ConfigError)
        ids = native_ids(self.loaded.tokenizers.target, [text])[0]
        self.check_length(ids, "target")
        return ids

    def warnings(
        self, src: Sequence[Sequence[int]], target: Sequence[int] | None = None
    ) -> list[str]:
        """What ``tformer generate`` warns of for these inputs: those longer than the model's
        max_len are read up to it (possible when --max-input-tokens is above it)."""
        max_len = self.model.config.max_len
        prompts = self.model.continues_prompts
        found = [
            long_inputs_warning([len(ids) for ids in src], max_len, prompts=prompts),
            None if target is None else long_target_warning(len(target), max_len, "target"),
        ]
        return [message for message in found if message is not None]

    def check_length(self, ids: Sequence[int], field: str) -> None:
        if len(ids) > self.max_input_tokens:
            raise ConfigError(
                f"{field} has {len(ids)} tokens; this server reads at most "
                f"{self.max_input_tokens} (tformer serve --max-input-tokens); shorten it"
            )

    def check_rows(self, inputs: int, config: DecodingConfig) -> None:
        rows = inputs * config.rows_per_input
        if rows > self.settings.max_rows:
            raise ConfigError(
                f"{inputs} input(s) x {rows // inputs} outputs each is {rows} rows; this "
                f"server decodes at most {self.settings.max_rows} for a request "
                "(tformer serve --max-rows); send fewer inputs, beams or samples"
            )

    def check_one_model(self, what: str) -> None:
        if isinstance(self.model, Ensemble) and len(self.model.members) > 1:
            raise ConfigError(
                f"{what} show one model; this server decodes an ensemble of "
                f"{len(self.model.members)} (tformer serve --ensemble)"
            )

    # -- answers --------------------------------------------------------------------------

    def outputs(
        self,
        texts: Sequence[str],
        hyps: list[list[Hypothesis]],
        config: DecodingConfig,
        warnings: list[str],
    ) -> dict[str, Any]:
        """The answer of ``/v1/translate``: each input with its outputs."""
        target = self.loaded.tokenizers.target
        flat = [hyp for per_input in hyps for hyp in per_input]
        decoded = iter(target.decode_batch([hyp.ids for hyp in flat]))
        results = [
            {
                "input": text,
                "outputs": [
                    output_record(next(decoded), hyp, index, config, target.tokens(hyp.ids))
                    for index, hyp in enumerate(per_input)
                ],
            }
            for text, per_input in zip(texts, hyps, strict=True)
        ]
        return {"results": results, "settings": settings_record(config), "warnings": warnings}

    def attention(self, request: AttentionRequest, decoding: DecodingConfig) -> dict[str, Any]:
        """Runs in the worker: the maps ``tformer inspect-attention`` computes."""
        self.check_one_model("attention maps")
        loaded = self.loaded
        result = attention_maps(
            loaded.model, loaded.tokenizers, request.source, request.target, decoding
        )
        selection = result.selection(
            request.kind, request.layer, request.head, checkpoint=str(loaded.path)
        )
        return attention_record(selection)

    def explanation(
        self,
        request: ExplainRequest,
        src: list[int],
        config: DecodingConfig,
        target: list[int] | None = None,
    ) -> dict[str, Any]:
        """Runs in the worker: ``generate --explain``'s table for one output, as JSON."""
        self.check_one_model("explanations")
        loaded = self.loaded
        tokenizers = loaded.tokenizers
        if target is None or request.target is None:
            outputs = translate(loaded.model, tokenizers, [request.source], config)[0]
            if request.output >= len(outputs):
                raise ConfigError(
                    f"output {request.output} is out of range: these settings give "
                    f"{len(outputs)} output(s) (0..{len(outputs) - 1})"
                )
            hyp, text = outputs[request.output].hypothesis, outputs[request.output].text
        else:
            ids = target[: loaded.model_config.max_len - 1]
            hyp, text = Hypothesis(ids=ids, token_logprobs=[], finished=True), request.target
        steps = explain(loaded.model, src, hyp, config)
        source_tokens = attended_tokens(loaded.model, tokenizers, src, hyp)
        return {
            "source": request.source,
            "output": text,
            "source_tokens": source_tokens,
            "stages": list(steps[0].probs) if steps else ["model"],
            "steps": explain_record(steps, source_tokens, tokenizers.target.id_to_token),
            "logprob": logprob_of(steps),
            "settings": settings_record(config),
        }


def native_ids(tokenizer: Tokenizer, texts: list[str]) -> list[list[int]]:
    """The ids ``tokenizer.encode_batch`` gives, from the native tokenizer itself: it lets go
    of the GIL, so requests tokenise side by side, where the word cache takes one batch at a
    time."""
    return [e.ids for e in tokenizer.inner.encode_batch_fast(texts, add_special_tokens=False)]

