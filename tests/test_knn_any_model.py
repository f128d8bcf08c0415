"""k-NN attention as a backend of any transformers model (`attn_implementation="knn"`): GPT-2, Llama with grouped-
query attention, BERT, ViT and AoT, built tiny from their configs (no download); and the models whose attention
passes the kernel more than a mask: T5 (`position_bias=`), Gemma 2 (`softcap=`), GPT-OSS (`s_aux=` sinks), and the
sliding windows of Gemma 2, GPT-OSS, Mistral and Qwen2 (in the mask; `sliding_window=` is for flash kernels only)."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import (
    AutoConfig,
    BertConfig,
    BertModel,
    Gemma2Config,
    Gemma2ForCausalLM,
    GPT2Config,
    GPT2LMHeadModel,
    GptOssConfig,
    GptOssForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    T5Config,
    T5ForConditionalGeneration,
    ViTConfig,
    ViTModel,
)
from transformers.masking_utils import AttentionMaskInterface, eager_mask
from transformers.modeling_utils import AttentionInterface

import aot_transformers.knn  # noqa: F401  (registers the backend)
from aot_transformers import AoTForCausalLM
from aot_transformers.knn import KNN_ATTENTION, check_knn_k, knn_attention_forward, use_knn_attention
from support import tiny_config

SMALL = dict(hidden_size=32, num_attention_heads=4, num_hidden_layers=2)


def gpt2(**kw):
    return GPT2LMHeadModel(GPT2Config(vocab_size=97, n_embd=32, n_head=4, n_layer=2, n_positions=64, **kw))


def llama(**kw):  # 4 query heads share 2 key/value heads
    config = LlamaConfig(
        vocab_size=97, intermediate_size=64, num_key_value_heads=2, max_position_embeddings=64, **SMALL
    )
    for name, value in kw.items():
        setattr(config, name, value)
    return LlamaForCausalLM(config)


def bert(**kw):
    config = BertConfig(vocab_size=97, intermediate_size=64, max_position_embeddings=64, **SMALL)
    for name, value in kw.items():
        setattr(config, name, value)
    return BertModel(config, add_pooling_layer=False)


def vit(**kw):
    config = ViTConfig(image_size=16, patch_size=4, intermediate_size=64, **SMALL)
    for name, value in kw.items():
        setattr(config, name, value)
    return ViTModel(config, add_pooling_layer=False)


def aot(**kw):
    return AoTForCausalLM(tiny_config(**kw))


BUILDERS = {"gpt2": gpt2, "llama": llama, "bert": bert, "vit": vit, "aot": aot}


def _inputs(name: str, batch: int = 2, length: int = 11) -> dict:
    if name == "vit":
        return {"pixel_values": torch.randn(batch, 3, 16, 16)}
    return {"input_ids": torch.randint(1, 97, (batch, length))}


def _with_backend(name: str, backend: str, knn_k=None):
    torch.manual_seed(0)  # the same weights whatever the backend
    model = BUILDERS[name]() if name != "aot" else aot(knn_k=knn_k)
    if name != "aot" and backend == KNN_ATTENTION:
        return use_knn_attention(model, knn_k)
    model.set_attn_implementation(backend)
    return model


def _output(model, inputs):
    out = model(**inputs)
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_knn_with_k_at_least_n_equals_dense_in_values_and_gradients(name):
    inputs = _inputs(name)
    dense = _with_backend(name, "eager").train()
    knn = _with_backend(name, KNN_ATTENTION, knn_k=64).train()
    for model in (dense, knn):
        for module in model.modules():  # dropout off, so that both runs see the same network
            if isinstance(module, torch.nn.Dropout):
                module.p = 0.0
    expected, got = _output(dense, inputs), _output(knn, inputs)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)
    expected.square().mean().backward()
    got.square().mean().backward()
    for (param_name, a), b in zip(dense.named_parameters(), knn.parameters(), strict=True):
        if a.grad is not None:
            torch.testing.assert_close(b.grad, a.grad, atol=1e-5, rtol=1e-4, msg=param_name)


def test_k_equal_one_picks_the_arg_max_key_with_grouped_query_heads():
    class Module(torch.nn.Module):
        is_causal = False
        config = type("Config", (), {"knn_k": 1})()

    query = torch.randn(1, 4, 6, 8)
    key, value = torch.randn(1, 2, 9, 8), torch.randn(1, 2, 9, 8)  # 2 key/value heads for 4 query heads
    out, _ = knn_attention_forward(Module(), query, key, value, None, scaling=0.5)
    shared_key, shared_value = key.repeat_interleave(2, dim=1), value.repeat_interleave(2, dim=1)
    best = (query @ shared_key.transpose(-1, -2)).argmax(-1)  # (1, 4, 6)
    expected = shared_value.gather(2, best[..., None].expand(-1, -1, -1, 8))  # (1, 4, 6, 8)
    torch.testing.assert_close(out, expected.transpose(1, 2))


@pytest.mark.parametrize("name", ["gpt2", "llama", "aot"])
def test_cached_generation_logits_equal_the_uncached_forward(name):
    model = _with_backend(name, KNN_ATTENTION, knn_k=0.5).eval()
    prompt = torch.randint(1, 97, (2, 7))
    for cache in ("dynamic", "static"):
        out = model.generate(
            prompt,
            max_new_tokens=8,
            do_sample=False,
            pad_token_id=0,
            cache_implementation=cache,
            output_logits=True,
            return_dict_in_generate=True,
        )
        with torch.no_grad():
            expected = model(out.sequences, use_cache=False).logits[:, prompt.shape[1] - 1 : -1]
        torch.testing.assert_close(torch.stack(out.logits, dim=1), expected, rtol=0, atol=1e-5, msg=cache)


@pytest.mark.parametrize("name", ["gpt2", "llama", "bert", "aot"])
def test_padding_never_changes_the_outputs_of_real_tokens(name):
    model = _with_backend(name, KNN_ATTENTION, knn_k=3).eval()
    ids = torch.randint(1, 97, (1, 8))
    left = name in ("gpt2", "llama", "aot")  # decoders pad on the left, encoders on the right
    pad = torch.zeros(1, 4, dtype=torch.long)
    padded = torch.cat([pad, ids], 1) if left else torch.cat([ids, pad], 1)
    mask = (torch.arange(12) >= 4 if left else torch.arange(12) < 8).long()[None]
    extra = {}
    if name != "bert":
        extra["position_ids"] = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        alone = _output(model, {"input_ids": ids})
        together = _output(model, {"input_ids": padded, "attention_mask": mask, **extra})
    real = mask[0].bool()
    torch.testing.assert_close(together[0, real], alone[0], atol=1e-5, rtol=1e-4)


def test_bidirectional_vision_model_keeps_k_keys_per_query():
    model = _with_backend("vit", KNN_ATTENTION, knn_k=5).eval()
    with torch.no_grad():
        out = model(**_inputs("vit"), output_attentions=True)
    kept = (out.attentions[0] > 0).sum(-1)
    assert torch.equal(kept, torch.full_like(kept, 5))  # 17 tokens see each other; each keeps exactly 5


@pytest.mark.parametrize(
    ("knn_k", "error", "match"),
    [
        (None, ValueError, "needs `knn_k`"),
        (0, ValueError, r"int in \[1, "),
        (1.5, ValueError, r"\(0.0, 1.0\]"),
        ("half", TypeError, "str"),
        (True, TypeError, "bool"),
    ],
)
def test_bad_knn_k_gets_a_clear_error_when_any_model_is_switched_to_knn(knn_k, error, match):
    with pytest.raises(error, match=match):
        _with_backend("gpt2", KNN_ATTENTION, knn_k=knn_k)


def test_numpy_knn_k_is_read_as_a_python_number():
    import numpy as np

    assert check_knn_k(np.float32(0.5)) == 0.5 and type(check_knn_k(np.int64(3))) is int


def test_the_readme_one_liner_gives_any_saved_model_knn_attention_and_saving_keeps_it(tmp_path):
    from transformers import AutoModelForCausalLM

    gpt2().save_pretrained(tmp_path / "dense")
    model = use_knn_attention(AutoModelForCausalLM.from_pretrained(tmp_path / "dense"), knn_k=0.5)
    assert model.config._attn_implementation == "knn" and model.config.knn_k == 0.5
    calls = []
    model.transformer.h[0].attn.register_forward_hook(lambda *args: calls.append(1))
    with torch.no_grad():
        model(torch.randint(1, 97, (1, 6)))
    assert calls
    model.save_pretrained(tmp_path / "knn")
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "knn", attn_implementation="knn")
    assert reloaded.config.knn_k == 0.5 and reloaded.config._attn_implementation == "knn"


# --- Models whose attention passes the kernel more than (query, key, value, mask, scaling, dropout) ------------------
#
# What transformers 5.24 hands `ALL_ATTENTION_FUNCTIONS[...]`, and what eager does with it:
# - T5 (`T5Attention.forward`): `position_bias=` (1, H, Tq, Tk), a separate kwarg, NOT folded into the mask; added
#   to `q·k` (scaling 1.0) before the mask. The learned `relative_attention_bias` of block 0 (encoder self, decoder
#   self) is trained through it and shared by every layer; cross-attention passes zeros. `is_causal`: encoder and
#   cross False, decoder self True (mask None there with the "knn" backend's boolean mask function).
# - Gemma 2: `softcap=` (`attn_logit_softcapping`): `c · tanh(s / c)` on the scaled scores, BEFORE the mask.
# - GPT-OSS: `s_aux=` (H,) sinks (the `sinks` parameter): one extra logit per head in the softmax, no value; trained.
# - `sliding_window=` (Gemma 2, GPT-OSS, Mistral, Qwen2): already in the mask built by `masking_utils`; a kernel must
#   not apply it again.
# k-NN over these: the k keys are chosen on the final logits (bias added, softcap applied), visible keys only, lowest
# key index first among ties; a sink is not a key (never counted in k, always in the softmax).


def t5(**kw):  # config attributes go in before construction: the encoder and decoder get copies of the config
    config = T5Config(vocab_size=97, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, dropout_rate=0.0)
    config.decoder_start_token_id, config.pad_token_id, config.eos_token_id = 0, 0, 1
    for name, value in kw.items():
        setattr(config, name, value)
    model = T5ForConditionalGeneration(config)
    with torch.no_grad():  # a bias large enough to reorder the keys, so that k-NN must select on q·k + bias
        for module in model.modules():
            if getattr(module, "has_relative_attention_bias", False):
                module.relative_attention_bias.weight.normal_(std=1.0)
    return model


def gemma2(**kw):  # layer 0 slides over 4 keys, layer 1 sees all; weights large enough for the cap to bite
    config = Gemma2Config(
        vocab_size=97,
        intermediate_size=64,
        num_key_value_heads=2,
        head_dim=8,
        query_pre_attn_scalar=8,
        sliding_window=4,
        attn_logit_softcapping=1.0,
        initializer_range=0.2,
        **SMALL,
    )
    for name, value in kw.items():
        setattr(config, name, value)
    return Gemma2ForCausalLM(config)


def gpt_oss(**kw):  # 2 experts, 1 per token; layer 0 slides over 4 keys, layer 1 sees all
    config = GptOssConfig(
        vocab_size=97,
        intermediate_size=32,
        num_key_value_heads=2,
        head_dim=8,
        num_local_experts=2,
        num_experts_per_tok=1,
        sliding_window=4,
        **SMALL,
    )
    for name, value in kw.items():
        setattr(config, name, value)
    model = GptOssForCausalLM(config)
    with torch.no_grad():  # sinks of different sizes per head (the default init leaves them near 0)
        for layer in model.model.layers:
            layer.self_attn.sinks.normal_(std=1.0)
    return model


def mistral(**kw):
    config = MistralConfig(
        vocab_size=97,
        intermediate_size=64,
        num_key_value_heads=2,
        sliding_window=4,
        max_position_embeddings=64,
        **SMALL,
    )
    for name, value in kw.items():
        setattr(config, name, value)
    return MistralForCausalLM(config)


def qwen2(**kw):  # every layer slides (max_window_layers=0)
    config = Qwen2Config(
        vocab_size=97,
        intermediate_size=64,
        num_key_value_heads=2,
        use_sliding_window=True,
        sliding_window=4,
        max_window_layers=0,
        **SMALL,
    )
    for name, value in kw.items():
        setattr(config, name, value)
    return Qwen2ForCausalLM(config)


ARGUMENT_BUILDERS = {"t5": t5, "gemma2": gemma2, "gpt_oss": gpt_oss, "mistral": mistral, "qwen2": qwen2}
# The parameters that train only through an argument the kernel receives besides query, key and value.
TRAINED_THROUGH_ARGUMENTS = {
    "t5": ["encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"]
    + ["decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"],
    "gpt_oss": ["model.layers.0.self_attn.sinks", "model.layers.1.self_attn.sinks"],
}
REFERENCE_ATTENTION = "knn_reference_for_tests"


def _build(name: str, backend: str, knn_k=None):
    torch.manual_seed(0)  # the same weights whatever the backend
    model = ARGUMENT_BUILDERS[name](knn_k=knn_k)
    model.set_attn_implementation(backend)
    return model


def _argument_inputs(name: str) -> dict:
    """11 tokens (longer than the sliding windows of 4); for T5, 7 decoder tokens and an encoder row padded on the
    right (the bias then meets a mask; every query still sees a key, so every output is compared)."""
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(2, 97, (2, 11), generator=generator)
    if name != "t5":
        return {"input_ids": ids}
    mask = torch.ones(2, 11, dtype=torch.long)
    mask[1, 8:] = 0
    decoder_ids = torch.randint(2, 97, (2, 7), generator=generator)
    return {"input_ids": ids, "attention_mask": mask, "decoder_input_ids": decoder_ids}


def _assert_same_values_and_gradients(expected_model, got_model, inputs, required=()):
    expected, got = expected_model(**inputs).logits, got_model(**inputs).logits
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)
    expected.square().mean().backward()
    got.square().mean().backward()
    for (param_name, a), b in zip(expected_model.named_parameters(), got_model.parameters(), strict=True):
        if param_name in required:
            assert a.grad is not None and a.grad.abs().max() > 0, param_name
            assert b.grad is not None, f"{param_name} gets no gradient"
        if a.grad is not None:
            assert b.grad is not None, f"{param_name} gets no gradient"
            torch.testing.assert_close(b.grad, a.grad, atol=1e-5, rtol=1e-4, msg=param_name)


def test_t5_relative_position_bias_is_added_to_the_scores_and_trains_with_k_at_least_n():
    """Encoder self-attention (bidirectional bias, padded row), decoder self-attention (causal bias) and
    cross-attention (zero bias): logits and every gradient, `relative_attention_bias` included, equal eager's."""
    inputs = _argument_inputs("t5")
    eager, knn = _build("t5", "eager").train(), _build("t5", KNN_ATTENTION, knn_k=64).train()
    _assert_same_values_and_gradients(eager, knn, inputs, required=TRAINED_THROUGH_ARGUMENTS["t5"])


def test_gemma2_logit_softcapping_is_applied_before_the_mask_with_k_at_least_n():
    """`softcap=1.0` on scores of order 1, with a sliding layer (window 4 < 11 tokens) and a full layer."""
    inputs = _argument_inputs("gemma2")
    eager, knn = _build("gemma2", "eager").train(), _build("gemma2", KNN_ATTENTION, knn_k=64).train()
    _assert_same_values_and_gradients(eager, knn, inputs)


def test_gpt_oss_attention_sinks_take_probability_mass_and_train_with_k_at_least_n():
    inputs = _argument_inputs("gpt_oss")
    eager, knn = _build("gpt_oss", "eager").train(), _build("gpt_oss", KNN_ATTENTION, knn_k=64).train()
    _assert_same_values_and_gradients(eager, knn, inputs, required=TRAINED_THROUGH_ARGUMENTS["gpt_oss"])


@pytest.mark.parametrize("name", ["mistral", "qwen2"])
def test_sliding_window_comes_from_the_mask_with_k_at_least_n(name):
    inputs = _argument_inputs(name)
    eager, knn = _build(name, "eager").train(), _build(name, KNN_ATTENTION, knn_k=1.0).train()
    _assert_same_values_and_gradients(eager, knn, inputs)


def _kept_count(knn_k, num_visible: torch.Tensor) -> torch.Tensor:
    if isinstance(knn_k, float):
        return torch.ceil(knn_k * num_visible).long().clamp(min=1).minimum(num_visible)
    return num_visible.clamp(max=knn_k)


def reference_knn_attention(
    module, query, key, value, attention_mask, scaling, dropout=0.0, position_bias=None, softcap=None, s_aux=None, **_
):
    """Dense k-NN attention written from eager: the logits as the model's eager function makes them (scaled `q·k`,
    then softcap, then position bias, then the additive mask), the `min(k, visible)` largest visible logits of each
    query kept (a stable sort: the lowest key index first among ties), and a softmax over them and the sinks."""
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    logits = torch.matmul(query, key.transpose(-1, -2)) * scaling  # (B, H, Tq, Tk)
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    if position_bias is not None:
        logits = logits + position_bias
    visible = torch.ones_like(logits, dtype=torch.bool)
    if attention_mask is not None:  # eager's masks: additive floats, the lowest value where a query may not look
        assert attention_mask.dtype != torch.bool
        logits = logits + attention_mask
        visible = visible & (attention_mask > torch.finfo(attention_mask.dtype).min / 2)
    elif module.is_causal and query.shape[2] > 1:
        raise AssertionError("eager masks are never left implicit for causal attention")
    logits = logits.masked_fill(~visible, -math.inf)
    order = torch.sort(logits.detach(), dim=-1, descending=True, stable=True).indices
    rank = torch.empty_like(order).scatter_(-1, order, torch.arange(order.shape[-1]).expand_as(order))
    kept = rank < _kept_count(module.config.knn_k, visible.sum(-1, keepdim=True))
    logits = logits.masked_fill(~kept, -math.inf)
    if s_aux is not None:
        sinks = s_aux.reshape(1, -1, 1, 1).expand(logits.shape[0], -1, logits.shape[2], 1)
        probs = torch.softmax(torch.cat([logits, sinks], dim=-1), dim=-1)[..., :-1]
    else:
        probs = torch.softmax(logits, dim=-1)
    output = torch.matmul(probs, value)
    return output.transpose(1, 2).contiguous(), probs


AttentionInterface.register(REFERENCE_ATTENTION, reference_knn_attention)
AttentionMaskInterface.register(REFERENCE_ATTENTION, eager_mask)


@pytest.mark.parametrize("name", sorted(ARGUMENT_BUILDERS))
def test_the_reference_with_k_at_least_n_equals_eager(name):
    """The reference below is eager attention when it keeps every key (this holds today; it checks the test)."""
    inputs = _argument_inputs(name)
    eager, reference = _build(name, "eager").train(), _build(name, REFERENCE_ATTENTION, knn_k=64).train()
    _assert_same_values_and_gradients(eager, reference, inputs, required=TRAINED_THROUGH_ARGUMENTS.get(name, ()))


@pytest.mark.parametrize("name", sorted(ARGUMENT_BUILDERS))
def test_small_k_selects_on_the_biased_capped_logits_and_normalises_with_the_sinks(name):
    """With k = 2 of up to 11 keys, the k-NN model equals the reference model: the keys are chosen on the logits
    after bias and softcap, and the sinks share the softmax with the two kept keys (values and gradients)."""
    inputs = _argument_inputs(name)
    reference = _build(name, REFERENCE_ATTENTION, knn_k=2).train()
    knn = _build(name, KNN_ATTENTION, knn_k=2).train()
    _assert_same_values_and_gradients(reference, knn, inputs, required=TRAINED_THROUGH_ARGUMENTS.get(name, ()))


def _cached_step_logits(model, inputs: dict) -> torch.Tensor:
    """Logits of the last token, decoded with a cache of the others (one query; T5's bias then has Tq = 1 and an
    offset, GPT-OSS's sinks and Gemma 2's cap meet a single query, the sliding layers a cropped cache)."""
    if "decoder_input_ids" in inputs:
        decoder_ids = inputs["decoder_input_ids"]
        first = model(**{**inputs, "decoder_input_ids": decoder_ids[:, :-1]}, use_cache=True)
        encoder = (first.encoder_last_hidden_state,)
        step = dict(encoder_outputs=encoder, attention_mask=inputs["attention_mask"], cache=first.cache)
        return model(decoder_input_ids=decoder_ids[:, -1:], **step).logits
    ids = inputs["input_ids"]
    first = model(ids[:, :-1], use_cache=True)
    return model(ids[:, -1:], cache=first.cache).logits


@pytest.mark.parametrize("name", ["gemma2", "gpt_oss", "mistral", "t5"])
def test_cached_decoding_step_equals_eager_with_k_at_least_n(name):
    inputs = _argument_inputs(name)
    eager, knn = _build(name, "eager").eval(), _build(name, KNN_ATTENTION, knn_k=64).eval()
    with torch.no_grad():
        expected, got = _cached_step_logits(eager, inputs), _cached_step_logits(knn, inputs)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)


def test_finite_values_of_an_additive_float_mask_are_added_to_the_scores():
    """A 4D float mask (a custom mask passed to a model goes to the kernel as it is) adds its values, as in eager:
    only the entries at the dtype's lowest value hide a key."""

    class Module(torch.nn.Module):
        is_causal = False
        config = type("Config", (), {"knn_k": 64})()

    query, key, value = torch.randn(2, 4, 6, 8), torch.randn(2, 4, 9, 8), torch.randn(2, 4, 9, 8)
    mask = torch.randn(2, 1, 6, 9) * 2.0
    mask[:, :, :, 7:] = torch.finfo(torch.float32).min
    out, _ = knn_attention_forward(Module(), query, key, value, mask, scaling=0.5)
    expected = torch.softmax(query @ key.transpose(-1, -2) * 0.5 + mask, dim=-1) @ value  # (B, H, Tq, D)
    torch.testing.assert_close(out, expected.transpose(1, 2), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize(
    ("setting", "value", "match"),
    [
        ("knn_k", -1, "knn_k"),
        ("knn_k", 10**30, "knn_k"),
        ("knn_k", 1.5, "knn_k"),
        ("knn_chunk_size", -1, "knn_chunk_size"),
        ("knn_chunk_size", "a", "knn_chunk_size"),
        ("knn_chunk_size", 1.5, "knn_chunk_size"),
    ],
)
def test_bad_knn_settings_of_any_model_are_refused_when_it_is_switched_or_at_its_first_forward(
    tmp_path, setting, value, match
):
    settings = {"knn_k": 2, setting: value}
    with pytest.raises((ValueError, TypeError), match=match):
        use_knn_attention(llama(), **settings)
    llama().save_pretrained(tmp_path)
    config = AutoConfig.from_pretrained(tmp_path)
    for name, given in settings.items():
        setattr(config, name, given)
    model = LlamaForCausalLM.from_pretrained(tmp_path, config=config, attn_implementation=KNN_ATTENTION)
    with pytest.raises((ValueError, TypeError), match=match):
        model(torch.randint(1, 97, (1, 6)))
