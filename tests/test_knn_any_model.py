"""k-NN attention as a backend of any transformers model (`attn_implementation="knn"`): GPT-2, Llama with grouped-
query attention, BERT, ViT and AoT, built tiny from their configs (no download)."""

from __future__ import annotations

import pytest
import torch
from transformers import (
    BertConfig,
    BertModel,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    ViTConfig,
    ViTModel,
)

import aot_transformers.knn  # noqa: F401  (registers the backend)
from aot_transformers import AoTForCausalLM
from aot_transformers.knn import KNN_ATTENTION, check_knn_k, knn_attention_backend
from conftest import tiny_config

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
    if name != "aot":
        model.config.knn_k = knn_k
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
    out, _ = knn_attention_backend(Module(), query, key, value, None, scaling=0.5)
    shared_key, shared_value = key.repeat_interleave(2, dim=1), value.repeat_interleave(2, dim=1)
    best = (query @ shared_key.transpose(-1, -2)).argmax(-1)  # (1, 4, 6)
    expected = shared_value.gather(2, best[..., None].expand(-1, -1, -1, 8))  # (1, 4, 6, 8)
    torch.testing.assert_close(out, expected.transpose(1, 2))


@pytest.mark.parametrize("name", ["gpt2", "llama", "aot"])
def test_cached_generation_equals_uncached(name):
    model = _with_backend(name, KNN_ATTENTION, knn_k=0.5).eval()
    prompt = torch.randint(1, 97, (2, 7))
    kwargs = dict(max_new_tokens=8, do_sample=False, pad_token_id=0)
    cached = model.generate(prompt, use_cache=True, **kwargs)
    uncached = model.generate(prompt, use_cache=False, **kwargs)
    assert torch.equal(cached, uncached)


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
        (0, ValueError, "int >= 1"),
        (1.5, ValueError, r"\(0, 1\]"),
        ("half", TypeError, "str"),
        (True, TypeError, "bool"),
    ],
)
def test_bad_knn_k_gets_a_clear_error(knn_k, error, match):
    model = _with_backend("gpt2", KNN_ATTENTION, knn_k=knn_k)
    with pytest.raises(error, match=match):
        model(**_inputs("gpt2"))


def test_numpy_knn_k_is_read_as_a_python_number():
    import numpy as np

    assert check_knn_k(np.float32(0.5)) == 0.5 and type(check_knn_k(np.int64(3))) is int


def test_the_readme_one_liner_loads_any_saved_model_with_knn_attention(tmp_path):
    from transformers import AutoModelForCausalLM

    gpt2().save_pretrained(tmp_path)
    model = AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="knn", knn_k=0.5)
    assert model.config._attn_implementation == "knn" and model.config.knn_k == 0.5
    calls = []
    model.transformer.h[0].attn.register_forward_hook(lambda *args: calls.append(1))
    with torch.no_grad():
        model(torch.randint(1, 97, (1, 6)))
    assert calls
