"""Autoregressive decoding: settings, steppers, greedy/sampling, beam search, logit processors.

``api`` holds the entry points (``decode`` a padded batch, ``decode_texts`` many sources in
input order, ``stream_tokens`` one source token by token); ``settings`` the
``DecodingConfig`` and ``Hypothesis``; ``steppers`` one decoder step with or without the
key/value cache; ``sampling`` greedy decoding and sampling; ``beam`` beam search; ``logits``
the logit processors.
"""

from tformer.decoding.api import decode, decode_texts, stream_tokens
from tformer.decoding.settings import DecodingConfig, Hypothesis

__all__ = ["DecodingConfig", "Hypothesis", "decode", "decode_texts", "stream_tokens"]
