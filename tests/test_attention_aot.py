"""Attention kernels: k-NN equals dense for large k, chunked equals the reference, masks and clamping; the MSSA
shared-projection kernel equals SDPA and is used only where it applies."""

from __future__ import annotations

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward as _sdpa

from aot_transformers import attention_aot
from aot_transformers.attention_aot import (
    _SharedProjectionAttention,
    eager_attention_forward,
    knn_attention_forward,
    knn_attention_reference,
    resolve_knn_k,
    shared_projection_attention_forward,
    subspace_attention,
)


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


@pytest.mark.parametrize("causal", [False, True])
def test_knn_with_k_at_least_n_equals_dense(causal):
    q, k, v = _qkv()
    dense, _ = eager_attention_forward(None, q, k, v, None, 0.3, is_causal=causal)
    for knn_k in (37, 100, 1.0):
        out, _ = knn_attention_forward(None, q, k, v, None, 0.3, is_causal=causal, knn_k=knn_k, knn_chunk_size=8)
        torch.testing.assert_close(out, dense)


def test_sdpa_equals_eager():
    q, k, v = _qkv(dtype=torch.float32)
    mask = _padding_mask([37, 20], 37)
    for is_causal, m in ((True, None), (False, None), (True, mask)):
        a, _ = sdpa_attention_forward(None, q, k, v, m, 0.3, is_causal=is_causal)
        b, _ = eager_attention_forward(None, q, k, v, m, 0.3, is_causal=is_causal)
        real = slice(None) if m is None else m.any(-1)[:, 0]  # queries that see a key (not left padding)
        torch.testing.assert_close(a[real], b[real], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("knn_k", [1, 5, 0.3])
@pytest.mark.parametrize("masking", ["none", "causal", "causal+padding", "cache"])
@pytest.mark.parametrize("chunk", [4, 16, 512])
def test_chunked_knn_equals_reference_values_and_gradients(knn_k, masking, chunk):
    q_len = 5 if masking == "cache" else 37
    q, k, v = _qkv(q_len=q_len, grad=True)
    mask, is_causal = None, masking != "none"
    if masking == "causal+padding":
        mask = _padding_mask([37, 11], 37)
    if masking == "cache":
        mask = _padding_mask([37, 30], 37, q_len=q_len)
    out, weights = knn_attention_forward(
        None, q, k, v, mask, 0.4, is_causal=is_causal, knn_k=knn_k, knn_chunk_size=chunk, output_attentions=True
    )
    ref, ref_weights = knn_attention_reference(None, q, k, v, mask, 0.4, is_causal=is_causal, knn_k=knn_k)
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(weights, ref_weights)
    grad_out = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), grad_out)
    ref_grads = torch.autograd.grad(ref, (q, k, v), grad_out)
    for g, r in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(g, r)


def test_knn_gradcheck():
    q, k, v = _qkv(batch=1, heads=2, q_len=9, k_len=9, dim=4, grad=True)
    mask = _padding_mask([9], 9)
    fn = lambda q, k, v: knn_attention_forward(None, q, k, v, mask, 0.5, knn_k=3, knn_chunk_size=4)[0]
    assert torch.autograd.gradcheck(fn, (q, k, v))


def test_knn_keeps_exactly_k_visible_keys_and_respects_masks():
    q, k, v = _qkv(q_len=20, k_len=20)
    mask = _padding_mask([20, 12], 20)
    _, weights = knn_attention_forward(
        None, q, k, v, mask, 0.3, is_causal=True, knn_k=4, knn_chunk_size=7, output_attentions=True
    )
    kept = (weights > 0).sum(-1)  # (B, H, Tq)
    visible = mask.sum(-1).expand_as(kept)
    real = visible > 0
    assert torch.equal(kept[real], torch.clamp(visible[real], max=4))
    assert not (weights > 0)[(~mask).expand_as(weights) & real[..., None]].any(), "attended to a masked key"
    # the kept keys carry the highest scores among the visible ones
    scores = (q @ k.transpose(-1, -2) * 0.3).masked_fill(~mask, float("-inf"))
    kept_min = scores.masked_fill(weights == 0, float("inf")).amin(-1)
    dropped_max = scores.masked_fill((weights > 0) | ~mask, float("-inf")).amax(-1)
    assert (kept_min[real] >= dropped_max[real]).all()


def test_k_equals_one_picks_argmax_key():
    q, k, v = _qkv()
    out, _ = knn_attention_forward(None, q, k, v, None, 1.0, knn_k=1)
    best = (q @ k.transpose(-1, -2)).argmax(-1)  # (B, H, Tq)
    expected = v.gather(2, best[..., None].expand(-1, -1, -1, v.shape[-1]))
    torch.testing.assert_close(out.transpose(1, 2), expected)


def test_ties_keep_exactly_k():
    q = torch.zeros(1, 1, 6, 4)
    k = torch.zeros(1, 1, 6, 4)
    v = torch.randn(1, 1, 6, 4)
    _, weights = knn_attention_forward(None, q, k, v, None, 1.0, knn_k=2, output_attentions=True)
    assert torch.equal((weights > 0).sum(-1), torch.full((1, 1, 6), 2))
    torch.testing.assert_close(weights.sum(-1), torch.ones(1, 1, 6))


def test_fully_masked_rows_are_finite():
    q, k, v = _qkv(dtype=torch.float32, grad=True)
    mask = _padding_mask([37, 5], 37)  # row 1 has 32 padded queries that see no key
    for kernel, kwargs in (
        (knn_attention_forward, dict(knn_k=3)),
        (eager_attention_forward, {}),
        (sdpa_attention_forward, {}),
    ):
        out, _ = kernel(None, q, k, v, mask, 0.3, **kwargs)
        assert torch.isfinite(out).all(), kernel.__name__
        out.sum().backward()
        assert all(torch.isfinite(t.grad).all() for t in (q, k, v)), kernel.__name__


def test_two_stage_topk_used_on_long_rows_matches_topk():
    torch.manual_seed(1)
    q, k, v = _qkv(batch=1, heads=2, q_len=40, k_len=512, dim=16, grad=True)
    out, _ = knn_attention_forward(None, q, k, v, None, 0.25, knn_k=8, knn_chunk_size=16)
    ref, _ = knn_attention_reference(None, q, k, v, None, 0.25, knn_k=8)
    torch.testing.assert_close(out, ref)


def test_resolve_knn_k():
    visible = torch.tensor([0, 1, 3, 10, 100])
    assert resolve_knn_k(4, visible).tolist() == [1, 1, 3, 4, 4]
    assert resolve_knn_k(0.5, visible).tolist() == [1, 1, 2, 5, 50]
    assert resolve_knn_k(1.0, visible).tolist() == [1, 1, 3, 10, 100]


def test_knn_bf16_finite_and_close():
    q, k, v = _qkv(batch=1, heads=2, q_len=300, k_len=300, dim=16, dtype=torch.float32)
    out32, _ = knn_attention_forward(None, q, k, v, None, 0.25, knn_k=16, is_causal=True)
    out16, _ = knn_attention_forward(
        None, q.bfloat16(), k.bfloat16(), v.bfloat16(), None, 0.25, knn_k=16, is_causal=True
    )
    assert torch.isfinite(out16).all()
    assert (out16.float() - out32).abs().mean() < 0.05


def test_subspace_attention_matches_written_out_formula():
    """MSSA(Z) = Σ_k U_k U_kᵀ Z φ(Zᵀ U_k U_kᵀ Z), with Z holding tokens as columns."""
    torch.manual_seed(0)
    d, n, heads, rank = 6, 5, 2, 3
    x = torch.randn(1, n, d, dtype=torch.float64)
    subspaces = torch.randn(heads, d, rank, dtype=torch.float64)
    z = x[0].T  # (d, N)
    expected = torch.zeros(d, n, dtype=torch.float64)
    for u in subspaces:
        gram = z.T @ u @ u.T @ z  # (N, N), symmetric
        expected += u @ u.T @ z @ torch.softmax(0.7 * gram, dim=0)  # φ normalises over keys
    got = subspace_attention(x, subspaces, phi="softmax", scaling=0.7)
    torch.testing.assert_close(got[0], expected.T)
    linear = subspace_attention(x, subspaces, phi="linear", scaling=0.7)
    expected_linear = sum(u @ u.T @ z @ (0.7 * z.T @ u @ u.T @ z) for u in subspaces)
    torch.testing.assert_close(linear[0], expected_linear.T)


def test_subspace_attention_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="subspaces"):
        subspace_attention(torch.randn(1, 4, 6), torch.randn(2, 5, 3))


# Lengths around the causal block of 64 queries: one block, exactly one, a remainder of one, several blocks.
@pytest.mark.parametrize("length", [2, 17, 64, 65, 150])
@pytest.mark.parametrize("causal", [True, False])
def test_shared_projection_kernel_equals_sdpa_values_and_gradients(causal, length):
    states = torch.randn(2, length, 3, 8, dtype=torch.float64).transpose(1, 2).requires_grad_(True)  # a head view
    grad = torch.randn(2, 3, length, 8, dtype=torch.float64)
    reference = torch.nn.functional.scaled_dot_product_attention(states, states, states, is_causal=causal, scale=0.3)
    output = _SharedProjectionAttention.apply(states, 0.3, causal)
    torch.testing.assert_close(output, reference, rtol=1e-12, atol=1e-12)
    (expected,) = torch.autograd.grad(reference, states, grad)
    (got,) = torch.autograd.grad(output, states, grad)
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("causal", [True, False])
def test_shared_projection_kernel_gradcheck(causal):
    states = torch.randn(1, 2, 70, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda s: _SharedProjectionAttention.apply(s, 0.5, causal), (states,))


def _count_shared_kernel_calls(monkeypatch):
    calls = []
    original = _SharedProjectionAttention.apply
    monkeypatch.setattr(_SharedProjectionAttention, "apply", lambda *args: calls.append(args) or original(*args))
    return calls


def test_shared_projection_backend_uses_its_kernel_only_where_it_applies(monkeypatch):
    calls = _count_shared_kernel_calls(monkeypatch)
    states = torch.randn(2, 3, 40, 8, requires_grad=True)
    run = lambda q, k, v, **kw: shared_projection_attention_forward(None, q, k, v, kw.pop("mask", None), 0.3, **kw)[0]

    reference = run(states.detach(), states.detach(), states.detach(), is_causal=True)
    assert calls == []  # inference: nothing to differentiate, SDPA saves less
    torch.testing.assert_close(run(states, states, states, is_causal=True), reference, atol=1e-6, rtol=1e-5)
    assert len(calls) == 1  # MSSA training step
    other = states.detach().clone().requires_grad_(True)
    run(states, other, other, is_causal=True)  # MHSA, or a query normalised apart from the keys
    run(states, states, states, is_causal=True, mask=_padding_mask([40, 30], 40))
    run(states, states, states, is_causal=True, dropout=0.1)
    run(states.double(), states.double(), states.double(), is_causal=True)
    with torch.no_grad():
        run(states, states, states, is_causal=True)
    assert len(calls) == 1
    monkeypatch.setitem(attention_aot.SHARED_KERNEL_MAX_LENGTH, False, 39)
    run(states, states, states, is_causal=False)  # longer than the bidirectional limit
    assert len(calls) == 1
    run(states, states, states, is_causal=True)
    assert len(calls) == 2


@pytest.mark.parametrize("model_class", ["AoTForCausalLM", "AoTForImageClassification"])
@pytest.mark.parametrize("checkpointing", [False, True])
def test_models_train_the_same_with_and_without_the_shared_kernel(monkeypatch, model_class, checkpointing):
    import aot_transformers
    from conftest import tiny_config

    calls = _count_shared_kernel_calls(monkeypatch)
    model = getattr(aot_transformers, model_class)(
        tiny_config(num_hidden_layers=3, max_position_embeddings=80)
    ).train()
    if checkpointing:
        model.gradient_checkpointing_enable()
    if model_class == "AoTForCausalLM":
        ids = torch.randint(0, 97, (3, 70))  # two causal blocks
        inputs = dict(input_ids=ids, labels=ids)
    else:
        inputs = dict(pixel_values=torch.randn(3, 3, 16, 16), labels=torch.tensor([0, 1, 4]))

    def loss_and_grads():
        model.zero_grad(set_to_none=True)
        loss = model(**inputs).loss
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in model.parameters()]

    model.set_attn_implementation("shared_projection")
    loss, grads = loss_and_grads()
    assert calls, "the MSSA training step did not use the shared-projection kernel"
    kernel_calls = len(calls)
    model.set_attn_implementation("sdpa")
    sdpa_loss, sdpa_grads = loss_and_grads()
    assert len(calls) == kernel_calls  # plain SDPA
    torch.testing.assert_close(loss, sdpa_loss, atol=1e-6, rtol=1e-6)
    for got, expected in zip(grads, sdpa_grads, strict=True):
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("causal", [False, True])
def test_tied_mssa_layer_is_the_papers_operator(causal):
    """AoT paper Eq. (4): with W^O = [U_1 … U_K] (`tie_output_projection`) the MSSA layer is `subspace_attention`."""
    from aot_transformers.modeling_aot import AoTAttention
    from conftest import tiny_config

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
    from conftest import tiny_config

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
    from conftest import tiny_config

    with pytest.raises(ValueError, match="tie_output_projection"):
        tiny_config(tie_output_projection=True, attention_type="mhsa")
