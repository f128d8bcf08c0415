"""The k-NN attention kernel: exact values and gradients against the reference (integer and fractional k, masks, a
missing mask read as SDPA reads it, chunk edges, ties, dropout, additive biases, soft-capping, sinks; both backward
modes, saved kept keys and recomputation; float32 and float64 scores), k >= n equals dense attention, memory saved
for the backward linear in the length, chunk temporaries within the memory budget, differentiable attention weights,
and `torch.export` with dynamic batch and sequence."""

from __future__ import annotations

import pytest
import torch
from torch.export import Dim

from aot_transformers import AoTForCausalLM, attention_aot, knn
from aot_transformers.attention_aot import eager_attention_forward, resolve_knn_k
from aot_transformers.knn import knn_attention_forward
from knn_reference import knn_attention_reference
from support import tiny_config

CHUNK = 8


def _qkv(batch=2, heads=2, q_len=17, k_len=17, dim=4, dtype=torch.float64):
    make = lambda n: torch.randn(batch, heads, n, dim, dtype=dtype, requires_grad=True)
    return make(q_len), make(k_len), make(k_len)


def _mask(masking: str, batch: int, q_len: int, k_len: int) -> tuple[torch.Tensor | None, bool]:
    """(attention_mask, is_causal) for a masking scheme. "cache": Tq < Tk with the last query at the last key (an
    explicit mask, as transformers builds it for a dynamic cache); "static": no mask and Tq < Tk, which means SDPA's
    `is_causal` aligned top-left (a static-cache prefill, whose later slots are empty)."""
    if masking in ("none", "causal", "static"):
        return None, masking != "none"
    key_valid = torch.ones(batch, k_len, dtype=torch.bool)
    if masking == "padding":
        key_valid[0, : k_len // 3] = False  # left padding on the first sequence
    causal = torch.arange(k_len)[None, :] <= torch.arange(q_len)[:, None] + (k_len - q_len)
    return key_valid[:, None, None, :] & causal, False


def _grads(output: torch.Tensor, inputs, upstream: torch.Tensor) -> list[torch.Tensor]:
    return list(torch.autograd.grad(output, inputs, upstream))


@pytest.mark.parametrize("knn_k", [1, 3, 0.5, 0.3])
@pytest.mark.parametrize("length", [CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK + 1])
@pytest.mark.parametrize("masking", ["none", "causal", "padding", "cache", "static"])
def test_chunked_knn_equals_reference_values_and_gradients(knn_k, length, masking):
    q_len = 3 if masking in ("cache", "static") else length
    q, k, v = _qkv(q_len=q_len, k_len=length)
    mask, is_causal = _mask(masking, 2, q_len, length)
    out, _ = knn_attention_forward(None, q, k, v, mask, 0.7, is_causal=is_causal, knn_k=knn_k, knn_chunk_size=CHUNK)
    ref, _ = knn_attention_reference(None, q, k, v, mask, 0.7, is_causal=is_causal, knn_k=knn_k)
    upstream = torch.randn_like(out)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
    for got, want in zip(_grads(out, (q, k, v), upstream), _grads(ref, (q, k, v), upstream), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("knn_k", [1, 3, 0.5, 100])
@pytest.mark.parametrize("masking", ["none", "causal", "padding", "additive", "cache", "static"])
@pytest.mark.parametrize("ties", [False, True])
def test_the_units_one_piece_knn_equals_the_chunked_kernel_values_and_gradients(knn_k, masking, ties):
    """What a folder loaded without the package runs (`attention_aot.eager_attention_forward` with `knn_k`): the keys,
    values, weights and gradients of the reference, and of the package's chunked kernel."""
    q_len = 5 if masking in ("cache", "static") else 19
    q, k, v = _qkv(q_len=q_len, k_len=19)
    if ties:  # scores from a few integer values (and a power-of-two scaling, so exact): many keys tie
        q, k = (torch.randint(-1, 2, t.shape).double().requires_grad_() for t in (q, k))
    mask, is_causal = _mask("padding" if masking == "additive" else masking, 2, q_len, 19)
    if masking == "additive":  # eager's mask function: 0 where a query may attend, the lowest float elsewhere
        mask = torch.zeros(mask.shape, dtype=torch.float64).masked_fill(~mask, torch.finfo(torch.float64).min)
    kwargs = dict(is_causal=is_causal, knn_k=knn_k)
    unit, weights = attention_aot.eager_attention_forward(None, q, k, v, mask, 0.5, **kwargs)
    ref, ref_weights = knn_attention_reference(None, q, k, v, mask, 0.5, **kwargs)
    chunked, _ = knn_attention_forward(None, q, k, v, mask, 0.5, knn_chunk_size=CHUNK, **kwargs)
    torch.testing.assert_close(unit, ref, rtol=0, atol=1e-12)
    torch.testing.assert_close(unit, chunked, rtol=0, atol=1e-12)
    torch.testing.assert_close(weights, ref_weights, rtol=0, atol=1e-12)
    upstream = torch.randn_like(unit)
    for got, want in zip(_grads(unit, (q, k, v), upstream), _grads(chunked, (q, k, v), upstream), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("knn_k", [1, 3])
@pytest.mark.parametrize("masking", ["none", "causal", "padding", "cache", "static"])
@pytest.mark.parametrize("ties", [False, True])
def test_small_k_two_stage_selection_equals_reference(knn_k, masking, ties):
    # n >= 16 k and a multiple of 4: the kernel selects through group maxima (`_top_width`).
    q, k, v = _qkv(q_len=5 if masking in ("cache", "static") else 64, k_len=64)
    if ties:  # scores from a few integer values (and a power-of-two scaling, so exact): many keys tie
        q, k = (torch.randint(-1, 2, t.shape).double().requires_grad_() for t in (q, k))
    mask, is_causal = _mask(masking, 2, q.shape[2], 64)
    out, _ = knn_attention_forward(None, q, k, v, mask, 0.5, is_causal=is_causal, knn_k=knn_k, knn_chunk_size=16)
    ref, _ = knn_attention_reference(None, q, k, v, mask, 0.5, is_causal=is_causal, knn_k=knn_k)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
    upstream = torch.randn_like(out)
    for got, want in zip(_grads(out, (q, k, v), upstream), _grads(ref, (q, k, v), upstream), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("knn_k", [2, 5, 0.5])
def test_ties_keep_exactly_min_k_visible_keys_lowest_index_first(knn_k):
    # Integer queries and keys drawn from three values: the float64 scores are exact and tie everywhere.
    make = lambda n: torch.randint(-1, 2, (2, 2, n, 3)).double().requires_grad_()
    q, k, v = make(13), make(13), torch.randn(2, 2, 13, 3, dtype=torch.float64, requires_grad=True)
    mask, _ = _mask("padding", 2, 13, 13)
    out, weights = knn_attention_forward(
        None, q, k, v, mask, 1.0, knn_k=knn_k, knn_chunk_size=4, output_attentions=True
    )
    chunked, _ = knn_attention_forward(None, q, k, v, mask, 1.0, knn_k=knn_k, knn_chunk_size=4)
    ref, ref_weights = knn_attention_reference(None, q, k, v, mask, 1.0, knn_k=knn_k)
    visible = (mask | ~mask.any(-1, keepdim=True)).expand(2, 2, 13, 13).sum(-1)  # a query seeing no key sees all
    expected = torch.minimum(torch.ceil(visible * knn_k).long(), visible) if isinstance(knn_k, float) else None
    expected = visible.clamp(max=knn_k) if expected is None else expected.clamp(min=1)
    assert torch.equal((weights > 0).sum(-1), expected)
    torch.testing.assert_close(weights, ref_weights, rtol=0, atol=1e-12)
    torch.testing.assert_close(chunked, ref, rtol=0, atol=1e-12)
    upstream = torch.randn_like(out)
    for got, want in zip(_grads(chunked, (q, k, v), upstream), _grads(ref, (q, k, v), upstream), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("knn_k", [3, 0.5])
def test_knn_gradcheck_with_and_without_dropout(knn_k):
    q, k, v = _qkv(batch=1, q_len=11, k_len=11, dim=3)
    mask, _ = _mask("padding", 1, 11, 11)

    def attend(q, k, v, dropout):
        generator = torch.Generator().manual_seed(3)  # the same dropout mask at every call
        return knn_attention_forward(
            None, q, k, v, mask, 0.5, dropout=dropout, knn_k=knn_k, knn_chunk_size=4, generator=generator
        )[0]

    assert torch.autograd.gradcheck(lambda q, k, v: attend(q, k, v, 0.0), (q, k, v))
    assert torch.autograd.gradcheck(lambda q, k, v: attend(q, k, v, 0.4), (q, k, v))
    assert not torch.allclose(attend(q, k, v, 0.4), attend(q, k, v, 0.0))


def test_dropout_output_is_the_dropped_probabilities_times_values():
    q, k, v = _qkv(batch=1, heads=1, q_len=9, k_len=9, dim=16)  # D > Tk: the values are independent
    generator = torch.Generator().manual_seed(5)
    out, _ = knn_attention_forward(
        None, q, k, v, None, 0.5, dropout=0.5, knn_k=4, knn_chunk_size=4, generator=generator
    )
    _, weights = knn_attention_reference(None, q, k, v, None, 0.5, knn_k=4)
    # Each output row is a combination of the kept values with weights 0 or 2 · p: solve for those weights.
    coefficients = torch.linalg.lstsq(v[0, 0].T.detach(), out[0, :, 0].T.detach()).solution.T  # (Tq, Tk)
    kept = weights[0, 0].detach()
    dropped_or_doubled = torch.where(coefficients.abs() < 1e-8, torch.zeros_like(kept), 2 * kept)
    torch.testing.assert_close(coefficients, dropped_or_doubled, rtol=0, atol=1e-8)


def _qkv_wide(batch=2, heads=3, q_len=37, k_len=37, dim=8, dtype=torch.float64, grad=False):
    make = lambda n: torch.randn(batch, heads, n, dim, dtype=dtype, requires_grad=grad)
    return make(q_len), make(k_len), make(k_len)


def _padding_mask(lengths, k_len):
    key_valid = torch.zeros(len(lengths), k_len, dtype=torch.bool)
    for row, n in enumerate(lengths):
        key_valid[row, k_len - n :] = True  # left padding
    return key_valid[:, None, None, :] & torch.ones(k_len, k_len, dtype=torch.bool).tril()


@pytest.mark.parametrize("causal", [False, True])
def test_knn_with_k_at_least_n_equals_dense(causal):
    q, k, v = _qkv_wide()
    dense, _ = eager_attention_forward(None, q, k, v, None, 0.3, is_causal=causal)
    for knn_k in (37, 100, 1.0):
        out, _ = knn_attention_forward(None, q, k, v, None, 0.3, is_causal=causal, knn_k=knn_k, knn_chunk_size=8)
        torch.testing.assert_close(out, dense)


def test_knn_gradcheck():
    q, k, v = _qkv_wide(batch=1, heads=2, q_len=9, k_len=9, dim=4, grad=True)
    mask = _padding_mask([9], 9)
    fn = lambda q, k, v: knn_attention_forward(None, q, k, v, mask, 0.5, knn_k=3, knn_chunk_size=4)[0]
    assert torch.autograd.gradcheck(fn, (q, k, v))


def test_knn_keeps_exactly_k_visible_keys_and_respects_masks():
    q, k, v = _qkv_wide(q_len=20, k_len=20)
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
    q, k, v = _qkv_wide()
    out, _ = knn_attention_forward(None, q, k, v, None, 1.0, knn_k=1)
    best = (q @ k.transpose(-1, -2)).argmax(-1)  # (B, H, Tq)
    expected = v.gather(2, best[..., None].expand(-1, -1, -1, v.shape[-1]))
    torch.testing.assert_close(out.transpose(1, 2), expected)


def test_two_stage_topk_used_on_long_rows_matches_topk():
    torch.manual_seed(1)
    q, k, v = _qkv_wide(batch=1, heads=2, q_len=40, k_len=512, dim=16, grad=True)
    out, _ = knn_attention_forward(None, q, k, v, None, 0.25, knn_k=8, knn_chunk_size=16)
    ref, _ = knn_attention_reference(None, q, k, v, None, 0.25, knn_k=8)
    torch.testing.assert_close(out, ref)


def test_resolve_knn_k():
    visible = torch.tensor([0, 1, 3, 10, 100])
    assert resolve_knn_k(4, visible).tolist() == [1, 1, 3, 4, 4]
    assert resolve_knn_k(0.5, visible).tolist() == [1, 1, 2, 5, 50]
    assert resolve_knn_k(1.0, visible).tolist() == [1, 1, 3, 10, 100]


def test_knn_bf16_finite_and_close():
    q, k, v = _qkv_wide(batch=1, heads=2, q_len=300, k_len=300, dim=16, dtype=torch.float32)
    out32, _ = knn_attention_forward(None, q, k, v, None, 0.25, knn_k=16, is_causal=True)
    out16, _ = knn_attention_forward(
        None, q.bfloat16(), k.bfloat16(), v.bfloat16(), None, 0.25, knn_k=16, is_causal=True
    )
    assert torch.isfinite(out16).all()
    assert (out16.float() - out32).abs().mean() < 0.05


def test_a_missing_mask_with_fewer_queries_than_keys_hides_the_keys_past_each_query():
    """SDPA's `is_causal` is aligned top-left: query i sees keys 0..i, so the empty slots of a static cache (keys
    past the last query) change nothing, and a single query sees every key."""
    q, k, v = _qkv(q_len=5, k_len=12)
    out, _ = knn_attention_forward(None, q, k, v, None, 0.7, is_causal=True, knn_k=2, knn_chunk_size=2)
    noisy_k, noisy_v = k.detach().clone(), v.detach().clone()
    noisy_k[:, :, 5:], noisy_v[:, :, 5:] = 100.0, 100.0  # slots no query may see
    noisy, _ = knn_attention_forward(None, q, noisy_k, noisy_v, None, 0.7, is_causal=True, knn_k=2)
    torch.testing.assert_close(noisy, out, rtol=0, atol=1e-12)
    single, _ = knn_attention_forward(None, q[:, :, :1], k, v, None, 0.7, is_causal=True, knn_k=12)
    dense, _ = eager_attention_forward(None, q[:, :, :1], k, v, None, 0.7, is_causal=False)
    torch.testing.assert_close(single, dense, rtol=0, atol=1e-12)


@pytest.mark.parametrize("knn_k", [2, 0.5, 100])
@pytest.mark.parametrize("argument", ["bias", "softcap", "sinks", "all"])
def test_biases_softcapping_and_sinks_are_applied_as_eager_attention_applies_them(knn_k, argument):
    """T5's position bias (an additive float mask), Gemma 2's soft-capping and GPT-OSS's sinks: values and
    gradients (the bias and the sinks are learned) equal the reference, chunk by chunk."""
    q, k, v = _qkv(q_len=11, k_len=11)
    bias = None
    if argument in ("bias", "all"):
        bias = torch.randn(1, 2, 11, 11, dtype=torch.float64)
        bias = bias.masked_fill(~_mask("padding", 2, 11, 11)[0][:1], torch.finfo(torch.float64).min)
        bias.requires_grad_()
    softcap = 1.5 if argument in ("softcap", "all") else None
    sinks = torch.randn(2, dtype=torch.float64, requires_grad=True) if argument in ("sinks", "all") else None
    kwargs = dict(knn_k=knn_k, softcap=softcap, s_aux=sinks)
    out, _ = knn_attention_forward(None, q, k, v, bias, 0.7, knn_chunk_size=4, **kwargs)
    ref, _ = knn_attention_reference(None, q, k, v, bias, 0.7, **kwargs)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
    inputs = [t for t in (q, k, v, bias, sinks) if t is not None]
    upstream = torch.randn_like(out)
    for got, want in zip(_grads(out, inputs, upstream), _grads(ref, inputs, upstream), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


def test_fractional_k_counts_keys_in_integers():
    """ceil(k · n) computed without float64 (which some accelerators lack), as a person would: 0.1 · 10 keeps 1 key
    (float64 gives 1.0000000000000002 before the ceiling on some paths), 0.3 · 10 keeps 3, 1/3 · 9 keeps 3."""
    visible = torch.tensor([0, 1, 3, 9, 10, 20, 30])
    assert resolve_knn_k(0.1, visible).tolist() == [1, 1, 1, 1, 1, 2, 3]
    assert resolve_knn_k(0.3, visible).tolist() == [1, 1, 1, 3, 3, 6, 9]
    assert resolve_knn_k(1 / 3, visible).tolist() == [1, 1, 1, 3, 4, 7, 10]
    assert resolve_knn_k(0.7, visible).tolist() == [1, 1, 3, 7, 7, 14, 21]


def _saved_bytes_beyond_inputs(length: int, knn_k) -> int:
    """Bytes autograd keeps for the kernel's backward, not counting the query, key and value themselves."""
    q, k, v = _qkv(batch=1, heads=2, q_len=length, k_len=length, dim=8, dtype=torch.float32)
    inputs = {t.untyped_storage().data_ptr() for t in (q, k, v)}
    saved = {}

    def pack(tensor):
        if tensor.untyped_storage().data_ptr() not in inputs:
            saved[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        knn_attention_forward(None, q, k, v, None, 0.125, is_causal=True, knn_k=knn_k, knn_chunk_size=64)
    return sum(saved.values())


@pytest.mark.parametrize("knn_k", [4, 32, 0.5])  # 4 <= the head width 8: the kept keys are saved
def test_backward_saves_memory_linear_in_the_length(knn_k):
    small, large = _saved_bytes_beyond_inputs(256, knn_k), _saved_bytes_beyond_inputs(1024, knn_k)
    # The output (T x D) and a few numbers per query; n x k indices (the previous kernel) would grow 16x here.
    assert large <= 4.1 * small
    assert large <= 2 * 1024 * (8 + 4) * 8


@pytest.mark.parametrize("knn_k", [2, 0.5, 100])
def test_attention_weights_are_differentiable_and_equal_the_reference(knn_k):
    q, k, v = _qkv()
    mask, _ = _mask("padding", 2, 17, 17)
    out, weights = knn_attention_forward(None, q, k, v, mask, 0.7, knn_k=knn_k, output_attentions=True)
    ref, ref_weights = knn_attention_reference(None, q, k, v, mask, 0.7, knn_k=knn_k)
    torch.testing.assert_close(weights, ref_weights, rtol=0, atol=1e-12)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
    upstream = torch.randn_like(weights)
    got = _grads(weights, (q, k), upstream)
    torch.testing.assert_close(got, _grads(ref_weights, (q, k), upstream), rtol=0, atol=1e-12)
    assert all(grad.abs().sum() > 0 for grad in got)
    if knn_k == 100:  # k >= n: the weights and their gradients are dense attention's
        _, dense = eager_attention_forward(None, q, k, v, mask, 0.7)  # its softmax runs in float32
        torch.testing.assert_close(got, _grads(dense, (q, k), upstream), rtol=0, atol=1e-6)


@pytest.mark.parametrize("attention_type", ["mssa", "mhsa"])
def test_a_loss_on_knn_attention_maps_trains_the_attention_projections(attention_type):
    model = AoTForCausalLM(tiny_config(knn_k=3, attention_type=attention_type))
    output = model(torch.randint(0, 97, (2, 9)), output_attentions=True)
    sum(attentions.square().sum() for attentions in output.attentions).backward()
    projection = model.model.layers[0].attention
    weights = [projection.subspace_proj] if attention_type == "mssa" else [projection.q_proj, projection.k_proj]
    assert all(layer.weight.grad is not None and layer.weight.grad.abs().sum() > 0 for layer in weights)


@pytest.mark.parametrize(("attention_type", "knn_k"), [("mssa", 3), ("mssa", 0.5), ("mhsa", 3), ("mhsa", 0.5)])
def test_knn_model_exports_with_dynamic_batch_and_sequence(attention_type, knn_k):
    model = AoTForCausalLM(tiny_config(knn_k=knn_k, attention_type=attention_type, knn_chunk_size=4)).eval()
    dynamic = {"input_ids": {0: Dim("batch", min=1, max=8), 1: Dim("sequence", min=2, max=64)}, "use_cache": None}
    inputs = {"input_ids": torch.randint(0, 97, (2, 10)), "use_cache": False}
    exported = torch.export.export(model, (), inputs, dynamic_shapes=dynamic).module()
    for shape in ((1, 7), (3, 23)):  # several chunks in eager mode, one in the exported program
        input_ids = torch.randint(0, 97, shape)
        with torch.no_grad():
            expected = model(input_ids=input_ids, use_cache=False).logits
        torch.testing.assert_close(exported(input_ids=input_ids, use_cache=False).logits, expected)


@pytest.fixture(params=["saved", "recomputed"])
def backward_mode(request, monkeypatch):
    """Run the kernel with its backward from saved kept keys (where allowed: no soft-capping, no dropout) or from
    recomputed scores, whatever `_saves_kept_keys` would choose."""
    saved = request.param == "saved"
    monkeypatch.setattr(
        knn,
        "_saves_kept_keys",
        lambda knn_k, max_k, head_dim, softcap, dropout: saved and softcap is None and dropout == 0.0,
    )
    return request.param


@pytest.mark.parametrize("knn_k", [1, 3, 0.5, 0.9, 100])
@pytest.mark.parametrize("masking", ["none", "causal", "padding", "cache", "static"])
@pytest.mark.parametrize("length", [CHUNK + 1, 64])  # 64: small k selects through group maxima
@pytest.mark.parametrize("ties", [False, True])
def test_both_backward_modes_equal_reference(backward_mode, knn_k, masking, length, ties):
    q_len = 5 if masking in ("cache", "static") else length
    q, k, v = _qkv(q_len=q_len, k_len=length)
    if ties:  # scores from a few integer values (and a power-of-two scaling, so exact): many keys tie
        q, k = (torch.randint(-1, 2, t.shape).double().requires_grad_() for t in (q, k))
    mask, is_causal = _mask(masking, 2, q_len, length)
    kwargs = dict(is_causal=is_causal, knn_k=knn_k)
    out, _ = knn_attention_forward(None, q, k, v, mask, 0.5, knn_chunk_size=CHUNK, **kwargs)
    ref, _ = knn_attention_reference(None, q, k, v, mask, 0.5, **kwargs)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
    upstream = torch.randn_like(out)
    for got, want in zip(_grads(out, (q, k, v), upstream), _grads(ref, (q, k, v), upstream), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("knn_k", [2, 0.5])
@pytest.mark.parametrize("argument", ["bias", "sinks", "both"])
def test_both_backward_modes_apply_biases_and_sinks(backward_mode, knn_k, argument):
    q, k, v = _qkv(q_len=11, k_len=11)
    bias = sinks = None
    if argument in ("bias", "both"):
        bias = torch.randn(1, 2, 11, 11, dtype=torch.float64)
        bias = bias.masked_fill(~_mask("padding", 2, 11, 11)[0][:1], torch.finfo(torch.float64).min)
        bias.requires_grad_()
    if argument in ("sinks", "both"):
        sinks = torch.randn(2, dtype=torch.float64, requires_grad=True)
    out, _ = knn_attention_forward(None, q, k, v, bias, 0.7, knn_k=knn_k, s_aux=sinks, knn_chunk_size=4)
    ref, _ = knn_attention_reference(None, q, k, v, bias, 0.7, knn_k=knn_k, s_aux=sinks)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
    inputs = [t for t in (q, k, v, bias, sinks) if t is not None]
    upstream = torch.randn_like(out)
    for got, want in zip(_grads(out, inputs, upstream), _grads(ref, inputs, upstream), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("knn_k", [1, 3, 0.5])
@pytest.mark.parametrize("masking", ["none", "causal", "padding"])
def test_float32_scores_select_exactly_as_the_reference(backward_mode, knn_k, masking):
    """float32 selects on int32 images of the scores (float64 on int64): integer inputs give exact, often tied
    scores, so the kept sets must be the reference's and the results equal to float32 rounding."""
    make = lambda n: torch.randint(-2, 3, (2, 2, n, 6)).float().requires_grad_()
    q, k, v = make(64), make(64), torch.randn(2, 2, 64, 6, requires_grad=True)
    mask, is_causal = _mask(masking, 2, 64, 64)
    kwargs = dict(is_causal=is_causal, knn_k=knn_k)
    out, _ = knn_attention_forward(None, q, k, v, mask, 0.5, knn_chunk_size=16, **kwargs)
    ref, _ = knn_attention_reference(None, q, k, v, mask, 0.5, **kwargs)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-6)
    upstream = torch.randn_like(out)
    for got, want in zip(_grads(out, (q, k, v), upstream), _grads(ref, (q, k, v), upstream), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("tie", ["zero", "zero, denormals flushed", "largest float"])
def test_tied_scores_keep_the_lowest_key_indices(backward_mode, dtype, tie):
    """-0.0 and +0.0 are equal scores: the lowest key indices among them are kept, whatever their signs; so too with
    denormals flushed to zero (the next float after 0 is then 0 as well) and for keys tied at the largest float."""
    largest = torch.finfo(dtype).max
    scores = (
        [0.0, -0.0, 1.0, -0.0, 0.0, -0.0, 0.0, -0.0]
        if tie != "largest float"
        else [largest] * 2 + [1.0] + [largest] * 5
    )
    key = torch.tensor(scores, dtype=dtype).reshape(1, 1, 8, 1).requires_grad_()
    query = torch.ones(1, 1, 3, 1, dtype=dtype, requires_grad=True)
    value = torch.randn(1, 1, 8, 4, dtype=dtype, requires_grad=True)
    if tie == "zero, denormals flushed" and not torch.set_flush_denormal(True):
        pytest.skip("this CPU cannot flush denormals")
    try:
        for knn_k in (2, 3, 0.5):
            out, _ = knn_attention_forward(None, query, key, value, None, 1.0, is_causal=False, knn_k=knn_k)
            ref, _ = knn_attention_reference(None, query, key, value, None, 1.0, is_causal=False, knn_k=knn_k)
            torch.testing.assert_close(out, ref, rtol=0, atol=1e-6)
            inputs, upstream = (query, key, value), torch.randn_like(out)
            grads = zip(_grads(out, inputs, upstream), _grads(ref, inputs, upstream), strict=True)
            for got, want in grads if tie != "largest float" else ():  # (the query's gradient overflows there)
                torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    finally:
        torch.set_flush_denormal(False)


def _peak_tensor_bytes(fn) -> float:
    """Peak bytes of CPU tensors allocated by `fn` and alive at once (the benchmark's profiler measurement)."""

    from benchmarks.bench_knn import peak_tensor_mb

    return peak_tensor_mb(fn) * 2**20


@pytest.mark.parametrize("knn_k", [4, 0.5, 100])  # saved kept keys; recomputation (fractional, and k > head width)
def test_chunk_temporaries_stay_within_the_memory_budget_and_knn_chunk_size_caps_them(monkeypatch, knn_k):
    q, k, v = _qkv(batch=2, heads=2, q_len=256, k_len=256, dim=16, dtype=torch.float32)
    upstream = torch.randn(2, 256, 2, 16)

    def step(chunk_size=None):
        out, _ = knn_attention_forward(None, q, k, v, None, 0.25, knn_k=knn_k, knn_chunk_size=chunk_size)
        torch.autograd.grad(out, (q, k, v), upstream)

    peaks = {}
    for budget in (0, 2**16, 2**18):  # one query per chunk; 4 and 16 queries
        monkeypatch.setattr(knn, "_KNN_CHUNK_BUDGET", budget)
        peaks[budget] = _peak_tensor_bytes(step)
    assert peaks[2**16] - peaks[0] <= 2**16
    assert peaks[2**18] - peaks[0] <= 2**18
    assert peaks[2**18] > peaks[2**16] > peaks[0]  # the budget is what bounds them
    assert _peak_tensor_bytes(lambda: step(chunk_size=1)) == peaks[0]  # knn_chunk_size=1 caps at one query


@pytest.mark.parametrize("rev", ["HEAD", "previous"])  # the kernel in knn.py; in attention_aot.py (before the move)
def test_the_benchmarks_previous_kernel_is_the_chunked_kernel_of_that_revision(rev):
    """benchmarks/bench_knn.py times this kernel against the one of an earlier revision, loaded from git: from knn.py,
    or attention_aot.py before the kernel moved (never the one-piece eager k-NN that attention_aot.py holds now), with
    the revision's own relative imports, and without changing the backends transformers runs for `"knn"` or the
    classes of transformers that the revision patched (a later test would otherwise run that revision's checks)."""
    from benchmarks.bench_knn import PREVIOUS_KERNEL_REV, previous_kernel
    from transformers import AttentionInterface, PretrainedConfig, PreTrainedModel
    from transformers.masking_utils import AttentionMaskInterface

    backends = lambda: (AttentionInterface()["knn"], AttentionMaskInterface()["knn"])
    classes = lambda: [dict(vars(cls)) for cls in (PretrainedConfig, PreTrainedModel)]
    registered, attributes = backends(), classes()
    kernel = previous_kernel("HEAD" if rev == "HEAD" else PREVIOUS_KERNEL_REV)
    if kernel is None:
        pytest.skip("not a git checkout with that revision")
    assert kernel.__module__.endswith(".knn" if rev == "HEAD" else ".attention_aot")
    assert kernel is not knn_attention_forward and backends() == registered and classes() == attributes
    torch.manual_seed(0)
    query, key, value = _qkv(batch=1, heads=2, q_len=9, k_len=9, dim=4, dtype=torch.float32)
    upstream = torch.randn(1, 9, 2, 4)
    for knn_k in (3, 0.5):
        got, _ = kernel(None, query, key, value, None, 0.5, knn_k=knn_k, knn_chunk_size=4)
        want, _ = knn_attention_forward(None, query, key, value, None, 0.5, knn_k=knn_k, knn_chunk_size=4)
        torch.testing.assert_close(got, want)
        inputs = (query, key, value)
        for a, b in zip(_grads(got, inputs, upstream), _grads(want, inputs, upstream), strict=True):
            torch.testing.assert_close(a, b)
