"""Attention maths against independent references: torch's own kernels and hand computation."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tformer.fast.attention import fused_backward_is_slow
from tformer.model.attention import (
    MultiHeadAttention,
    causal_mask,
    padding_mask,
    scaled_dot_product_attention,
)
from tformer.model.cache import KVCache


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def test_hand_computed_single_query() -> None:
    # One query, two keys: scores q.k / sqrt(2) = [1/sqrt(2), 0] -> softmax by hand.
    q = torch.tensor([[[[1.0, 0.0]]]])
    k = torch.tensor([[[[1.0, 0.0], [0.0, 1.0]]]])
    v = torch.tensor([[[[10.0, 0.0], [0.0, 10.0]]]])
    out, weights = scaled_dot_product_attention(q, k, v, need_weights=True)
    a = math.exp(1 / math.sqrt(2))
    expected_w = torch.tensor([a / (a + 1), 1 / (a + 1)])
    assert weights is not None
    torch.testing.assert_close(weights[0, 0, 0], expected_w)
    torch.testing.assert_close(out[0, 0, 0], 10 * expected_w)


@pytest.mark.parametrize("need_weights", [False, True])
@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("masking", ["none", "padding", "causal", "both"])
def test_matches_torch_sdpa(need_weights: bool, fused: bool, masking: str) -> None:
    b, h, length, d = 3, 4, 7, 8
    q, k, v = (torch.randn(b, h, length, d) for _ in range(3))
    ids = torch.tensor([[5] * 7, [5] * 4 + [0] * 3, [5] * 6 + [0]])
    mask = padding_mask(ids, 0) if masking in ("padding", "both") else None
    causal = masking in ("causal", "both")
    ours, weights = scaled_dot_product_attention(
        q, k, v, mask, causal=causal, need_weights=need_weights, fused=fused
    )
    ref_mask = mask
    if causal:
        tri = torch.ones(length, length, dtype=torch.bool).tril()
        ref_mask = tri if mask is None else mask & tri
    reference = F.scaled_dot_product_attention(q, k, v, attn_mask=ref_mask)
    torch.testing.assert_close(ours, reference, atol=1e-5, rtol=1e-5)
    if need_weights:
        assert weights is not None
        torch.testing.assert_close(weights.sum(-1), torch.ones(b, h, length))
        if mask is not None:  # no weight on padding keys
            assert float(weights.masked_select(~mask.expand_as(weights)).abs().max()) == 0.0
        if causal:  # no weight on future keys
            assert float(weights.triu(diagonal=1).abs().max()) == 0.0


@pytest.mark.parametrize("masking", ["padding", "causal"])
def test_bf16_training_path_matches_torch_sdpa_in_fp32(masking: str) -> None:
    # bf16 training on a CPU takes the explicit path (the fused backward is slow there):
    # its output and gradients must still be torch's attention, within bf16 rounding.
    b, h, length, d = 4, 2, 9, 16
    leaves = [torch.randn(b, h, length, d, requires_grad=True) for _ in range(3)]
    ids = torch.tensor([[5] * 9, [5] * 4 + [0] * 5, [5] * 8 + [0], [5] * 2 + [0] * 7])
    mask = padding_mask(ids, 0) if masking == "padding" else None
    causal = masking == "causal"
    low = [x.to(torch.bfloat16) for x in leaves]
    assert fused_backward_is_slow(low[0], length)
    ours, weights = scaled_dot_product_attention(*low, mask, causal=causal, fused=False)
    assert weights is None and ours.dtype == torch.bfloat16
    upstream = torch.randn(b, h, length, d)
    ours.backward(upstream.to(torch.bfloat16))
    our_grads = [x.grad.clone() for x in leaves if x.grad is not None]
    for x in leaves:
        x.grad = None
    reference = F.scaled_dot_product_attention(*leaves, attn_mask=mask, is_causal=causal)
    reference.backward(upstream)
    torch.testing.assert_close(ours.float(), reference, atol=3e-2, rtol=3e-2)
    for mine, theirs in zip(our_grads, [x.grad for x in leaves], strict=True):
        torch.testing.assert_close(mine, theirs, atol=5e-2, rtol=5e-2)


def test_only_reduced_precision_cpu_training_leaves_the_fused_kernel() -> None:
    x = torch.randn(1, 1, 2, 4, requires_grad=True)
    assert not fused_backward_is_slow(x, 2)  # fp32
    assert fused_backward_is_slow(x.to(torch.bfloat16), 2)
    assert fused_backward_is_slow(x.to(torch.float16), 2)
    assert fused_backward_is_slow(x.to(torch.bfloat16), 4096)  # on a CPU, at any length
    with torch.no_grad():
        assert not fused_backward_is_slow(x.to(torch.bfloat16), 2)  # inference
    assert not fused_backward_is_slow(x.detach().to(torch.bfloat16), 2)


def test_causal_mask_with_offset() -> None:
    mask = causal_mask(2, 5)[0, 0]
    assert mask.tolist() == [
        [True, True, True, True, False],
        [True, True, True, True, True],
    ]


def _copy_into_torch_mha(
    ours: MultiHeadAttention, d_model: int, heads: int
) -> nn.MultiheadAttention:
    ref = nn.MultiheadAttention(d_model, heads, batch_first=True)
    k_w, v_w = ours.kv_proj.weight.chunk(2, dim=0)
    k_b, v_b = ours.kv_proj.bias.chunk(2, dim=0)
    with torch.no_grad():
        ref.in_proj_weight.copy_(torch.cat([ours.q_proj.weight, k_w, v_w]))
        ref.in_proj_bias.copy_(torch.cat([ours.q_proj.bias, k_b, v_b]))
        ref.out_proj.weight.copy_(ours.out_proj.weight)
        ref.out_proj.bias.copy_(ours.out_proj.bias)
    return ref.eval()


@pytest.mark.parametrize("mode", ["self-padding", "self-causal", "cross-padding"])
def test_multi_head_matches_torch_multihead_attention(mode: str) -> None:
    d_model, heads = 32, 4
    ours = MultiHeadAttention(d_model, heads).eval()
    ref = _copy_into_torch_mha(ours, d_model, heads)
    x = torch.randn(2, 6, d_model)
    memory = torch.randn(2, 9, d_model) if mode.startswith("cross") else x
    ids = torch.ones(2, memory.size(1), dtype=torch.long)
    ids[1, -3:] = 0  # padding at the end of the second row
    mask = padding_mask(ids, 0)
    causal = mode == "self-causal"
    out, weights = ours(x, memory, None if causal else mask, causal=causal, need_weights=True)
    if causal:
        ref_out, ref_w = ref(
            x,
            x,
            x,
            attn_mask=~torch.ones(6, 6, dtype=torch.bool).tril(),
            average_attn_weights=False,
        )
    else:
        ref_out, ref_w = ref(
            x, memory, memory, key_padding_mask=ids == 0, average_attn_weights=False
        )
    torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(weights, ref_w, atol=1e-5, rtol=1e-5)
    fused, none = ours(x, memory, None if causal else mask, causal=causal)
    assert none is None
    torch.testing.assert_close(fused, ref_out, atol=1e-5, rtol=1e-5)


def test_static_cache_projects_memory_once() -> None:
    attn = MultiHeadAttention(8, 2).eval()
    memory = torch.randn(1, 4, 8)
    cache = KVCache()
    attn(torch.randn(1, 1, 8), memory, cache=cache, static_kv=True)
    first_k = cache.k
    assert first_k is not None
    # A different memory is ignored once cached: the projection is reused, not recomputed.
    attn(torch.randn(1, 1, 8), torch.randn(1, 4, 8), cache=cache, static_kv=True)
    assert cache.k is not None and cache.k.data_ptr() == first_k.data_ptr()
    torch.testing.assert_close(cache.k, attn.project_kv(memory)[0], rtol=0, atol=0)


@pytest.mark.parametrize("grad", [False, True], ids=["decoding", "with-gradients"])
def test_incremental_self_attention_with_cache_equals_full_past_capacity_and_reorder(
    grad: bool,
) -> None:
    # 40 steps cross the buffer's doublings (16 -> 32 -> 64); every step must still equal
    # the full causal pass, and reordering rows must carry the cached past along (decoding
    # copies only the filled steps of the buffer).
    torch.set_grad_enabled(grad)
    try:
        _cache_equals_full_past()
    finally:
        torch.set_grad_enabled(True)


def _cache_equals_full_past() -> None:
    d_model, heads, length = 16, 4, 40
    attn = MultiHeadAttention(d_model, heads).eval()
    x = torch.randn(3, length, d_model)
    full, _ = attn(x, x, causal=True)
    cache = KVCache()
    half = length // 2 + 3
    steps = [
        attn(x[:, t : t + 1], x[:, t : t + 1], causal=True, cache=cache)[0] for t in range(half)
    ]
    index = torch.tensor([2, 0])
    cache.reorder(index)
    x, full = x[index], full[index]
    steps = [s[index] for s in steps]
    steps += [
        attn(x[:, t : t + 1], x[:, t : t + 1], causal=True, cache=cache)[0]
        for t in range(half, length)
    ]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)
    assert cache.length == length and cache.k is not None
    assert cache.k.shape == (2, heads, length, d_model // heads)
