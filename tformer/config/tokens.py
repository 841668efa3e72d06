"""The special tokens every tformer vocabulary starts with, at fixed ids."""

from __future__ import annotations

# The special tokens every tformer vocabulary starts with, at these ids: the tokenizer
# reserves them and the model masks padding by them.
PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIAL_TOKENS: tuple[str, ...] = (PAD, BOS, EOS, UNK)
PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3
# A masked language model's tokenizer has one more special token, right after those four.
MASK, MASK_ID = "<mask>", 4
