"""AoT models: causal LM and image classifier behaviour, generation, variants, errors."""

from __future__ import annotations

import copy

import pytest
import torch
from huggingface_hub.errors import StrictDataclassError

from aot_transformers import AoTForCausalLM, AoTForImageClassification, AoTModel, AoTVisionModel
from support import tiny_config

TEXT_VARIANTS = {
    "mssa": dict(attention_type="mssa", normalize_query=True),
    "mhsa": dict(attention_type="mhsa"),
    "mssa-knn": dict(attention_type="mssa", knn_k=3, knn_chunk_size=5),
    "mhsa-knn-frac": dict(attention_type="mhsa", knn_k=0.5, knn_chunk_size=4),
    "hybrid": dict(mlp_layers="first_half", num_hidden_layers=4),
    "full": dict(mlp_layers="all"),
    "no-ln-step": dict(layer_norm=False, step_size=0.3),
}


def _lm(**overrides) -> AoTForCausalLM:
    return AoTForCausalLM(tiny_config(**overrides)).eval()


def _ids(batch=2, length=12, vocab=97):
    return torch.randint(0, vocab, (batch, length))


@pytest.mark.parametrize("variant", sorted(TEXT_VARIANTS))
def test_future_tokens_never_change_past_logits(variant):
    model = _lm(**TEXT_VARIANTS[variant])
    ids = _ids(length=16)
    changed = ids.clone()
    changed[:, 9:] = (changed[:, 9:] + 1) % 97
    with torch.no_grad():
        a, b = model(ids).logits, model(changed).logits
    torch.testing.assert_close(a[:, :9], b[:, :9])
    assert not torch.allclose(a[:, 9:], b[:, 9:])


@pytest.mark.parametrize("variant", sorted(TEXT_VARIANTS))
def test_cached_generation_logits_equal_the_uncached_forward(variant):
    # By value, not by greedy tokens: an untrained model's argmax hides logit errors of 0.3 and more.
    model = _lm(**TEXT_VARIANTS[variant])
    prompt = _ids(batch=1, length=5)
    out = model.generate(
        prompt,
        max_new_tokens=12,
        do_sample=False,
        use_cache=True,
        output_logits=True,
        return_dict_in_generate=True,
    )
    with torch.no_grad():
        expected = model(out.sequences, use_cache=False).logits[0, prompt.shape[1] - 1 : -1]
    torch.testing.assert_close(torch.cat(out.logits), expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("variant", ["mssa", "mhsa", "mssa-knn"])
def test_left_padded_batch_logits_equal_unpadded_single_runs(variant):
    model = _lm(**TEXT_VARIANTS[variant], pad_token_id=0)
    prompts = [torch.randint(1, 97, (1, n)) for n in (7, 4)]
    width = max(p.shape[1] for p in prompts)
    batch = torch.zeros(2, width, dtype=torch.long)
    mask = torch.zeros(2, width, dtype=torch.long)
    for row, p in enumerate(prompts):
        batch[row, width - p.shape[1] :] = p
        mask[row, width - p.shape[1] :] = 1
    with torch.no_grad():
        padded_logits = model(batch, attention_mask=mask).logits
    generated = model.generate(
        batch, attention_mask=mask, max_new_tokens=6, do_sample=False, output_logits=True, return_dict_in_generate=True
    )
    for row, p in enumerate(prompts):
        with torch.no_grad():
            single = model(p).logits
            # The row's real tokens alone, no padding, no cache: what each decoding step's logits must equal.
            alone = model(torch.cat([p[0], generated.sequences[row, width:]])[None], use_cache=False).logits[0]
        torch.testing.assert_close(padded_logits[row, width - p.shape[1] :], single[0], atol=1e-5, rtol=1e-4)
        steps = torch.stack([logits[row] for logits in generated.logits])  # (6, V)
        torch.testing.assert_close(steps, alone[p.shape[1] - 1 : -1], atol=1e-5, rtol=0)


def test_beam_search_runs():
    model = _lm(attention_type="mssa")
    out = model.generate(_ids(batch=2, length=4), max_new_tokens=5, num_beams=3, do_sample=False)
    assert out.shape == (2, 9)


def test_mssa_cache_holds_one_tensor_half_of_mhsa():
    sizes = {}
    for attention_type in ("mssa", "mhsa"):
        model = _lm(attention_type=attention_type)
        with torch.no_grad():
            cache = model(_ids(length=10), use_cache=True).cache
        sizes[attention_type] = sum(
            layer.keys.numel() * layer.keys.element_size() + layer.values.numel() * layer.values.element_size()
            for layer in cache.layers
        )
        assert cache.get_seq_length() == 10
    assert sizes["mssa"] * 2 == sizes["mhsa"]


def test_sdpa_eager_and_output_attentions_agree():
    model = _lm(attention_type="mssa")
    ids = _ids()
    with torch.no_grad():
        sdpa = model(ids).logits
        model.config._attn_implementation = "eager"
        eager = model(ids, output_attentions=True, output_hidden_states=True)
    torch.testing.assert_close(sdpa, eager.logits, atol=1e-5, rtol=1e-4)
    assert len(eager.attentions) == 2 and eager.attentions[0].shape == (2, 4, 12, 12)
    assert len(eager.hidden_states) == 3 and eager.hidden_states[-1].shape == (2, 12, 32)
    torch.testing.assert_close(eager.attentions[0].sum(-1), torch.ones(2, 4, 12))
    assert torch.all(eager.attentions[0].triu(1) == 0)


def test_hidden_states_are_the_layer_outputs_and_can_be_selected_by_index():
    """transformers' output recorder: the embeddings, each layer's residual stream, the last one normalised (as
    GPT-2's); `output_hidden_states=[i, ...]` keeps only those entries, with the same values."""
    model = _lm()
    ids = _ids()
    with torch.no_grad():
        full = model.model(ids, output_hidden_states=True)
        selected = model.model(ids, output_hidden_states=[0, -1]).hidden_states
        embeddings = model.model.embed_tokens(ids) + model.model.embed_positions(torch.arange(ids.shape[1]))
        first_layer = model.model.layers[0](embeddings, None)
    torch.testing.assert_close(full.hidden_states[0], embeddings)
    torch.testing.assert_close(full.hidden_states[1], first_layer)
    torch.testing.assert_close(full.hidden_states[-1], full.last_hidden_state)
    assert len(selected) == len(full.hidden_states) and selected[1] is None
    torch.testing.assert_close(selected[0], full.hidden_states[0])
    torch.testing.assert_close(selected[-1], full.hidden_states[-1])


def test_knn_attentions_have_k_nonzeros():
    model = _lm(knn_k=3)
    with torch.no_grad():
        attentions = model(_ids(), output_attentions=True).attentions
    kept = (attentions[0] > 0).sum(-1)
    assert torch.equal(kept, torch.clamp(torch.arange(1, 13), max=3).expand(2, 4, 12))


def test_return_tuple_and_logits_to_keep():
    model = _lm()
    ids = _ids()
    with torch.no_grad():
        full = model(ids).logits
        last = model(ids, logits_to_keep=1).logits
        as_tuple = model(ids, return_dict=False, use_cache=False)
    assert last.shape == (2, 1, 97)
    torch.testing.assert_close(last[:, 0], full[:, -1])
    assert isinstance(as_tuple, tuple) and torch.equal(as_tuple[0], full)


def test_loss_matches_manual_shifted_cross_entropy():
    model = _lm()
    ids = _ids()
    labels = ids.clone()
    labels[0, :3] = -100
    out = model(ids, labels=labels)
    logits = out.logits[:, :-1].reshape(-1, 97)
    expected = torch.nn.functional.cross_entropy(logits, labels[:, 1:].reshape(-1), ignore_index=-100)
    torch.testing.assert_close(out.loss, expected)


def test_loss_with_num_items_in_batch_makes_accumulation_exact():
    """Trainer passes num_items_in_batch: summed micro-batch losses equal the loss of the whole batch."""
    model = _lm()
    ids = _ids(batch=4)
    labels = ids.clone()
    labels[0, :8] = -100  # uneven token counts per micro-batch
    whole = model(ids, labels=labels).loss
    num_items = (labels[:, 1:] != -100).sum()
    parts = sum(model(ids[i : i + 2], labels=labels[i : i + 2], num_items_in_batch=num_items).loss for i in (0, 2))
    torch.testing.assert_close(parts, whole)


@pytest.mark.parametrize("variant", sorted(TEXT_VARIANTS))
def test_variants_train_loss_goes_down(variant):
    torch.manual_seed(0)
    model = AoTForCausalLM(tiny_config(**TEXT_VARIANTS[variant])).train()
    ids = _ids(batch=4, length=16)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(30):
        loss = model(ids, labels=ids).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.7 * losses[0]


def test_gradient_checkpointing_gives_same_gradients():
    model = AoTForCausalLM(tiny_config(knn_k=4)).train()
    ids = _ids()
    model(ids, labels=ids).loss.backward()
    reference = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    # `activation_checkpointing_enable` (transformers >= 5.24) was `gradient_checkpointing_enable` before.
    enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
    enable()
    model(ids, labels=ids).loss.backward()
    for p, g in zip(model.parameters(), reference, strict=True):
        torch.testing.assert_close(p.grad, g)


def test_parameter_layout_mssa_vs_mhsa():
    mssa = dict(AoTModel(tiny_config(attention_type="mssa")).layers[0].attention.named_parameters())
    mhsa = dict(AoTModel(tiny_config(attention_type="mhsa")).layers[0].attention.named_parameters())
    assert sorted(mssa) == ["o_proj.weight", "subspace_proj.weight"]
    assert sorted(mhsa) == ["k_proj.weight", "o_proj.weight", "q_proj.weight", "v_proj.weight"]


def test_no_mlp_unless_ablation():
    names = [n for n, _ in AoTForCausalLM(tiny_config()).named_parameters()]
    assert not any("mlp" in n for n in names)
    hybrid = AoTForCausalLM(tiny_config(num_hidden_layers=4, mlp_layers="first_half")).model.layers
    assert [layer.mlp is not None for layer in hybrid] == [True, True, False, False]


def test_tied_embeddings():
    model = _lm()
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    untied = _lm(tie_word_embeddings=False)
    assert untied.lm_head.weight.data_ptr() != untied.model.embed_tokens.weight.data_ptr()


def test_step_size_scales_the_residual_update():
    config = tiny_config(num_hidden_layers=1, step_size=1.0)
    model = AoTModel(config).eval()
    half = AoTModel(tiny_config(num_hidden_layers=1, step_size=0.5)).eval()
    half.load_state_dict(model.state_dict())
    ids = _ids()
    with torch.no_grad():
        embed = model.embed_tokens(ids) + model.embed_positions(torch.arange(12))
        full_update = model.layers[0](embed) - embed
        half_update = half.layers[0](embed) - embed
    torch.testing.assert_close(half_update, 0.5 * full_update)


# --- bad input --------------------------------------------------------------------------------------------------


def test_token_ids_out_of_vocab_raise():
    model = _lm()
    # Values are checked on the device's time (`torch._assert_async`): on CPU at once, as an `AoTInputError`, which
    # is a ValueError (as transformers users catch bad input) and a RuntimeError (as a device-side assert raises).
    with pytest.raises(ValueError, match=r"input_ids.*\[0, 96\]") as caught:
        model(torch.tensor([[1, 2, 97]]))
    assert isinstance(caught.value, RuntimeError) and str(caught.value) == "`input_ids` must lie in [0, 96]."
    with pytest.raises(ValueError, match="input_ids"):
        model(torch.tensor([[-1, 2]]))
    with pytest.raises(TypeError, match="input_ids"):
        model(torch.tensor([[1.0, 2.0]]))


def test_sequence_longer_than_positions_raises():
    model = _lm(max_position_embeddings=16)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        model(_ids(length=17))
    ok = model.generate(_ids(batch=1, length=10), max_new_tokens=6, do_sample=False)
    assert ok.shape[1] == 16


def test_bad_attention_mask_shape_raises():
    with pytest.raises(ValueError, match="attention_mask"):
        _lm()(_ids(), attention_mask=torch.ones(2, 5))


def test_input_ids_and_embeds_exclusive():
    with pytest.raises(ValueError, match="exactly one"):
        _lm()(_ids(), inputs_embeds=torch.randn(2, 12, 32))


# --- vision -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides",
    [dict(), dict(attention_type="mhsa"), dict(layer_norm=False), dict(pooling="mean"), dict(knn_k=0.5)],
)
def test_image_classifier_forward_and_training(overrides):
    torch.manual_seed(0)
    model = AoTForImageClassification(tiny_config(**overrides)).train()
    pixels = torch.randn(8, 3, 16, 16)
    labels = torch.arange(8) % 5
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(25):
        out = model(pixels, labels=labels)
        optimizer.zero_grad()
        out.loss.backward()
        optimizer.step()
        losses.append(out.loss.item())
    assert out.logits.shape == (8, 5)
    assert losses[-1] < 0.5 * losses[0]


def test_vision_model_is_bidirectional_and_pools():
    model = AoTVisionModel(tiny_config()).eval()
    model.set_attn_implementation("eager")  # the backend that returns attention weights
    pixels = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        out = model(pixels, output_attentions=True, output_hidden_states=True)
        changed = pixels.clone()
        changed[..., 12:, 12:] = torch.randn(2, 3, 4, 4)  # last patch only
        cls_changed = model(changed).pooler_output
    assert out.last_hidden_state.shape == (2, 17, 32)
    torch.testing.assert_close(out.pooler_output, out.last_hidden_state[:, 0])
    assert out.attentions[0].shape == (2, 4, 17, 17) and (out.attentions[0].triu(1) > 0).any()
    assert not torch.allclose(cls_changed, out.pooler_output), "the CLS token must see later patches"


@pytest.mark.parametrize(
    ("shape", "match"),
    [((2, 1, 16, 16), "num_channels"), ((2, 3, 32, 32), "image_size"), ((3, 16, 16), "pixel_values")],
)
def test_wrong_image_shape_raises(shape, match):
    model = AoTForImageClassification(tiny_config())
    with pytest.raises(ValueError, match=match):
        model(torch.randn(*shape))


def test_labels_out_of_range_raise():
    model = AoTForImageClassification(tiny_config())
    with pytest.raises(ValueError, match="num_labels=5"):
        model(torch.randn(2, 3, 16, 16), labels=torch.tensor([0, 5]))


def test_lm_labels_out_of_vocabulary_raise_but_ignore_index_passes():
    model = _lm()
    ids = _ids()
    labels = ids.clone()
    labels[0, 3] = -100
    assert torch.isfinite(model(ids, labels=labels).loss)
    labels[1, 5] = 97
    with pytest.raises(ValueError, match=r"vocab_size=97.*-100"):
        model(ids, labels=labels)


@pytest.mark.parametrize("value", [2, -1, 0.5])
def test_attention_mask_values_other_than_zero_and_one_raise(value):
    ids = _ids()
    mask = torch.ones(ids.shape, dtype=torch.float32)
    mask[0, 0] = value
    with pytest.raises(ValueError, match="1 for real tokens and 0 for padding"):
        _lm()(ids, attention_mask=mask)


def test_negative_position_ids_raise():
    ids = _ids()
    with pytest.raises(ValueError, match="position_ids"):
        _lm()(ids, position_ids=torch.arange(-1, 11).expand(2, -1))


def test_token_classification_labels_out_of_range_raise():
    from aot_transformers import AoTForTokenClassification

    model = AoTForTokenClassification(tiny_config(num_labels=3))
    labels = torch.zeros(2, 12, dtype=torch.long)
    labels[0, 0] = 3
    with pytest.raises(IndexError, match="Target 3 is out of bounds"):  # transformers' token-classification loss
        model(_ids(), labels=labels)


def test_a_numpy_integer_for_an_int_field_is_refused_naming_the_field_as_transformers_configs_do():
    import numpy as np

    with pytest.raises(StrictDataclassError, match="'hidden_size' expected int, got int64"):
        tiny_config(hidden_size=np.int64(32))
    assert tiny_config(step_size=np.float64(0.5)).step_size == 0.5  # a float subclass


@pytest.mark.parametrize("shape", [(0, 5), (2, 0)])
def test_an_empty_batch_or_sequence_gets_a_clear_error(shape):
    with pytest.raises(ValueError, match="at least one sequence of at least one token"):
        _lm()(torch.zeros(shape, dtype=torch.long))
    with pytest.raises(ValueError, match="at least one image"):
        AoTForImageClassification(tiny_config())(torch.zeros(0, 3, 16, 16))


def test_inputs_of_the_wrong_kind_or_not_finite_get_a_clear_error():
    model = _lm()
    with pytest.raises(TypeError, match="input_ids.*tensor.*list"):
        model([[1, 2, 3]])
    with pytest.raises(TypeError, match="labels.*integer"):
        model(_ids(), labels=_ids().float())
    embeds = torch.randn(2, 5, 32)
    embeds[1, 2, 3] = float("nan")
    with pytest.raises(ValueError, match="inputs_embeds.*finite"):
        model(inputs_embeds=embeds)
    pixels = torch.randn(2, 3, 16, 16)
    pixels[0, 0, 0, 0] = float("inf")
    with pytest.raises(ValueError, match="pixel_values.*finite"):
        AoTForImageClassification(tiny_config())(pixels)


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (dict(num_labels=0), "num_labels"),
        (dict(mlp_layers="all", mlp_ratio=1e-9), "mlp_ratio"),
        (dict(eos_token_id=[-1, 5]), "eos_token_id"),
        (dict(eos_token_id=[3, 999]), "eos_token_id"),
        (dict(initializer_range=1e300), r"(?s)initializer_range.*smaller or equal to 100\.0"),  # all-NaN logits
        (dict(step_size=1e308), r"(?s)step_size.*greater than 0\.0 and smaller or equal to 100\.0"),  # overflows
        (dict(step_size=1e30), "step_size"),  # NaN logits
    ],
)
def test_configs_that_would_build_a_wrong_model_are_refused(overrides, match):
    with pytest.raises(StrictDataclassError, match=match):
        AoTForImageClassification(tiny_config(**overrides))


def test_the_largest_allowed_step_size_and_initializer_range_give_finite_logits():
    torch.manual_seed(0)
    model = AoTForCausalLM(tiny_config(step_size=100.0, initializer_range=100.0, num_hidden_layers=4))
    assert torch.isfinite(model(_ids()).logits).all()


def test_sampling_from_a_nan_model_and_allocating_a_huge_one_fail_as_gpt2_does():
    # transformers' own models raise torch's errors here; AoT raises the same ones (the command line checks the size
    # against the machine's memory before it builds a model).
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=100, n_embd=32, n_head=2, n_layer=1)).eval()
    for model in (_lm().eval(), gpt2):
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.fill_(float("nan"))
        with pytest.raises(RuntimeError, match="probability tensor contains either `inf`, `nan` or element < 0"):
            model.generate(_ids()[:1], do_sample=True, max_new_tokens=2, pad_token_id=0)
    with pytest.raises(RuntimeError, match="can't allocate memory"):
        GPT2LMHeadModel(GPT2Config(vocab_size=10**12, n_embd=32, n_head=2, n_layer=1))
    with pytest.raises(RuntimeError, match="can't allocate memory"):
        AoTForCausalLM(tiny_config(vocab_size=10**12))


@pytest.mark.parametrize("tied", [False, True])
def test_dynamically_quantised_model_gives_logits_close_to_the_float_model(tied):
    """`torch.ao` dynamic quantisation replaces each Linear by one without an autograd kernel; a tied MSSA output
    projection (the subspace projection's transpose) reads the quantised weight, with gradients enabled or not."""
    model = AoTForCausalLM(tiny_config(attention_type="mssa", tie_output_projection=tied)).eval()
    quantised = torch.ao.quantization.quantize_dynamic(copy.deepcopy(model), {torch.nn.Linear}, dtype=torch.qint8)
    ids = torch.randint(0, 97, (2, 9))
    expected = model(ids).logits.detach()
    for grad in (True, False):
        with torch.set_grad_enabled(grad):
            logits = quantised(ids).logits
        assert (logits - expected).abs().max() < 0.05 * expected.abs().max()
