"""CRATE (Yu et al., https://arxiv.org/abs/2306.01129) as an AoT option: `mlp_layers="all", mlp_type="ista"` puts
an ISTA block, `Z ↦ ReLU(Z + η·Dᵀ(Z − D·Z) − η·λ)` without a residual, after every MSSA block."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from huggingface_hub.errors import StrictDataclassError

from aot_transformers import AoTForCausalLM, AoTForImageClassification
from aot_transformers.modeling_aot import AoTIsta
from support import tiny_config

pytestmark = pytest.mark.usefixtures("one_thread")

CRATE = dict(mlp_layers="all", mlp_type="ista")


def _ista(x: torch.Tensor, dictionary: torch.Tensor, step_size: float, sparsity: float) -> torch.Tensor:
    """The ISTA step of the CRATE paper written for column tokens z: ReLU(z + η Dᵀ(z − D z) − η λ)."""
    z = x.reshape(-1, x.shape[-1]).T  # (d, B·T)
    return torch.relu(z + step_size * dictionary.T @ (z - dictionary @ z) - step_size * sparsity).T.reshape(x.shape)


def test_ista_step_equals_the_papers_formula_and_crates_code_and_zeroes_negative_codes():
    ista = AoTIsta(tiny_config(**CRATE, ista_step_size=0.3, ista_lambda=0.2))
    with torch.no_grad():
        ista.dictionary.copy_(torch.randn(32, 32) / math.sqrt(32))
    x = torch.randn(2, 7, 32)
    with torch.no_grad():
        output = ista(x)
    D = ista.dictionary.detach()
    torch.testing.assert_close(output, _ista(x, D, 0.3, 0.2), atol=1e-6, rtol=0)
    # CRATE's official `FeedForward.forward`, with its `weight` as our `dictionary`.
    crate = F.relu(x + 0.3 * (F.linear(x, D.t()) - F.linear(F.linear(x, D), D.t())) - 0.3 * 0.2)
    torch.testing.assert_close(output, crate, atol=1e-6, rtol=0)
    # The ReLU zeroes negative pre-activations exactly: the block replaces x (a residual would leave x there).
    negative = x + 0.3 * (x - x @ D.T) @ D - 0.3 * 0.2 < 0
    assert 0.2 < negative.float().mean() < 0.8
    assert (output[negative] == 0).all() and (output[~negative] > 0).all()


def test_dictionary_is_initialised_kaiming_uniform_as_crate():
    model = AoTForImageClassification(tiny_config(**CRATE, hidden_size=64))
    dictionary = model.model.layers[0].mlp.dictionary
    bound = math.sqrt(6 / 64)  # kaiming_uniform_ with a=0: U(-sqrt(6 / fan_in), sqrt(6 / fan_in))
    assert dictionary.shape == (64, 64) and dictionary.abs().max() <= bound
    assert dictionary.std().item() == pytest.approx(bound / math.sqrt(3), rel=0.05)


def test_crate_layer_output_is_ista_of_layer_norm_of_the_mssa_residual_and_trains():
    torch.manual_seed(0)
    model = AoTForImageClassification(tiny_config(**CRATE)).eval()
    layer = model.model.layers[0]
    assert hasattr(layer.attention, "subspace_proj") and not hasattr(layer.attention, "q_proj")  # MSSA
    assert not layer.attention.config.normalize_query and isinstance(layer.mlp, AoTIsta)
    x = torch.randn(2, 17, 32)  # (B, N+1, d): 16 patches and the CLS token
    with torch.no_grad():
        half = x + layer.attention(layer.attention_norm(x))[0]  # Z + MSSA(LN1(Z))
        expected = _ista(layer.mlp_norm(half), layer.mlp.dictionary, 0.1, 0.1)  # no residual around ISTA
        torch.testing.assert_close(layer(x), expected, atol=1e-6, rtol=0)

    model.train()
    out = model(torch.randn(4, 3, 16, 16), labels=torch.arange(4))
    out.loss.backward()
    assert out.logits.shape == (4, 5) and torch.isfinite(out.loss)
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())


def test_crate_image_classifier_round_trips_through_save_pretrained(tmp_path):
    model = AoTForImageClassification(tiny_config(**CRATE, ista_step_size=0.2, ista_lambda=0.05)).eval()
    pixels = torch.randn(2, 3, 16, 16)
    model.save_pretrained(tmp_path)
    loaded, info = AoTForImageClassification.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    config = loaded.config
    assert (config.mlp_type, config.ista_step_size, config.ista_lambda) == ("ista", 0.2, 0.05)
    with torch.no_grad():
        assert torch.equal(loaded.eval()(pixels).logits, model(pixels).logits)


def test_crate_causal_lm_cached_generation_equals_the_uncached_forward():
    # The ISTA block acts on each token alone, so the text models take it unchanged (causal, cacheable).
    model = AoTForCausalLM(tiny_config(**CRATE)).eval()
    prompt = torch.randint(0, 97, (1, 5))
    out = model.generate(
        prompt, max_new_tokens=8, do_sample=False, output_logits=True, return_dict_in_generate=True
    )  # fmt: skip
    with torch.no_grad():
        expected = model(out.sequences, use_cache=False).logits[0, prompt.shape[1] - 1 : -1]
    torch.testing.assert_close(torch.cat(out.logits), expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (dict(mlp_type="crate"), r"'mlp_type' expected one of \('mlp', 'ista'\), got crate"),
        (dict(ista_step_size=0.0), r"'ista_step_size':\s+ValueError: Value must be greater than 0.0 .*, got 0.0"),
        (dict(ista_lambda=-0.1), r"'ista_lambda':\s+ValueError: Value must be greater or equal to 0.0 .*, got -0.1"),
    ],
)
def test_bad_crate_fields_raise_an_error_naming_field_value_and_choices(overrides, message):
    with pytest.raises(StrictDataclassError, match=message):
        tiny_config(**{**CRATE, **overrides})
