"""The eager kernel and the MSSA layer: SDPA equals eager, padding rows stay finite, the tied MSSA layer is the
paper's operator, causal MSSA normalises its queries."""

from __future__ import annotations

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward as _sdpa

from aot_transformers import knn
from aot_transformers.attention_aot import eager_attention_forward
from aot_transformers.experiments.subspace import subspace_attention


def sdpa_attention_forward(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    """transformers' SDPA backend, called in the argument order of the package's kernels (bidirectional unless told,
    as they are for a bare call)."""
    kwargs.setdefault("is_causal", False)
    return _sdpa(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)


def _qkv(batch=2, heads=3, q_len=37, k_len=37, dim=8, dtype=torch.float64, grad=False):
    make = lambda n: torch.randn(batch, heads, n, dim, dtype=dtype, requires_grad=grad)
    return make(q_len), make(k_len), make(k_len)


def _padding_mask(lengths, k_len, causal=True, q_len=None):
    q_len = q_len or k_len
    key_valid = torch.zeros(len(lengths), k_len, dtype=torch.bool)
    for row, n in enumerate(lengths):
        key_valid[row, k_len - n :] = True  # left padding
    mask = key_valid[:, None, None, :]
    if causal:
        offset = k_len - q_len
        mask = mask & (torch.arange(k_len)[None, :] <= torch.arange(q_len)[:, None] + offset)
    return mask


def test_sdpa_equals_eager():
    q, k, v = _qkv(dtype=torch.float32)
    mask = _padding_mask([37, 20], 37)
    for is_causal, m in ((True, None), (False, None), (True, mask)):
        a, _ = sdpa_attention_forward(None, q, k, v, m, 0.3, is_causal=is_causal)
        b, _ = eager_attention_forward(None, q, k, v, m, 0.3, is_causal=is_causal)
        real = slice(None) if m is None else m.any(-1)[:, 0]  # queries that see a key (not left padding)
        torch.testing.assert_close(a[real], b[real], atol=1e-5, rtol=1e-5)


def test_fully_masked_rows_are_finite():
    q, k, v = _qkv(dtype=torch.float32, grad=True)
    mask = _padding_mask([37, 5], 37)  # row 1 has 32 padded queries that see no key
    for kernel, kwargs in (
        (eager_attention_forward, dict(knn_k=3)),  # the unit's one-piece k-NN
        (knn.knn_attention_forward, dict(knn_k=3)),  # the package's chunked k-NN
        (eager_attention_forward, {}),
        (sdpa_attention_forward, {}),
    ):
        out, _ = kernel(None, q, k, v, mask, 0.3, **kwargs)
        assert torch.isfinite(out).all(), kernel.__name__
        out.sum().backward()
        assert all(torch.isfinite(t.grad).all() for t in (q, k, v)), kernel.__name__


@pytest.mark.parametrize("causal", [False, True])
def test_tied_mssa_layer_is_the_papers_operator(causal):
    """AoT paper Eq. (4): with W^O = [U_1 … U_K] (`tie_output_projection`) the MSSA layer is `subspace_attention`."""
    from aot_transformers.modeling_aot import AoTAttention
    from support import tiny_config

    config = tiny_config(tie_output_projection=True)
    config._attn_implementation = "eager"
    layer = AoTAttention(config, layer_idx=0, is_causal=causal).double()
    assert layer.o_proj is None
    tokens = torch.randn(2, 9, 32, dtype=torch.float64)
    heads, width = config.num_attention_heads, config.head_dim
    subspaces = layer.subspace_proj.weight.view(heads, width, -1).transpose(1, 2)  # (K, d, p): U_k = rows of W
    mask = torch.ones(9, 9, dtype=torch.bool).tril()[None, None] if causal else None
    expected = subspace_attention(tokens, subspaces, "softmax", scaling=width**-0.5, attention_mask=mask)
    got, _ = layer(tokens, attention_mask=mask)
    torch.testing.assert_close(got, expected)


def test_causal_mssa_normalises_its_queries():
    """AoT paper Sec. 3 (causal AoT-MSSA): the query side is projected onto the unit sphere, no 1/sqrt(D)."""
    from aot_transformers import AoTForCausalLM
    from support import tiny_config

    model = AoTForCausalLM(tiny_config(normalize_query=True)).eval()
    model.set_attn_implementation("eager")
    captured = {}
    layer = model.model.layers[0]
    layer.attention.subspace_proj.register_forward_hook(lambda mod, args, out: captured.setdefault("u", out))
    with torch.no_grad():
        weights = model(torch.randint(0, 97, (1, 7)), output_attentions=True).attentions[0]
    u = captured["u"].view(1, 7, 4, 8).transpose(1, 2)  # (B, H, T, D)
    scores = torch.nn.functional.normalize(u, dim=-1) @ u.transpose(-1, -2)
    scores = scores.masked_fill(~torch.ones(7, 7, dtype=torch.bool).tril(), float("-inf"))
    torch.testing.assert_close(weights, torch.softmax(scores, dim=-1))


def test_tied_output_projection_needs_mssa():
    from huggingface_hub.errors import StrictDataclassError

    from support import tiny_config

    with pytest.raises(StrictDataclassError, match="tie_output_projection"):
        tiny_config(tie_output_projection=True, attention_type="mhsa")
