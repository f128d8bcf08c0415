"""Property-based tests over the config and the model boundary (hypothesis).

Every generated case either runs with finite outputs or raises ValueError/TypeError whose message names the
offending argument — never an IndexError/RuntimeError from inside torch, never NaN/inf from finite inputs.
The number of cases tried is printed at the end of the session (`pytest -s`) and reported in benchmarks/README.md.
"""

from __future__ import annotations

import math
import re

import pytest
import torch
from huggingface_hub.errors import StrictDataclassError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aot_transformers import AoTConfig, AoTForCausalLM, AoTForImageClassification

CASES = {"config": 0, "text": 0, "vision": 0, "errors": 0}
SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])

FIELD_VALUES = {
    "hidden_size": st.sampled_from([8, 12, 16, 17, 0, -4, 2.5, "16", None]),
    "num_attention_heads": st.sampled_from([1, 2, 4, 3, 0, -1, 1.0]),
    "num_hidden_layers": st.sampled_from([1, 2, 0, -1, 3.0]),
    "vocab_size": st.sampled_from([5, 31, 0, -2, "31"]),
    "max_position_embeddings": st.sampled_from([4, 16, 0]),
    "attention_type": st.sampled_from(["mssa", "mhsa", "MSSA", "", 3]),
    "knn_k": st.one_of(
        st.none(), st.integers(-3, 40), st.floats(-1, 2), st.just(math.nan), st.just("3"), st.just(True)
    ),
    "step_size": st.one_of(st.floats(-1, 3), st.sampled_from([math.nan, math.inf]), st.just("1")),
    "normalize_query": st.sampled_from([True, False, 1, "no"]),
    "layer_norm": st.sampled_from([True, False, None]),
    "mlp_layers": st.sampled_from(["none", "first_half", "all", "half", None]),
    "mlp_ratio": st.sampled_from([1.0, 2, 0, -1.0]),
    "image_size": st.sampled_from([8, 12, 16, 10, 0]),
    "patch_size": st.sampled_from([2, 4, 3, 0]),
    "num_channels": st.sampled_from([1, 3, 0]),
    "pooling": st.sampled_from(["cls", "mean", "max"]),
    "knn_chunk_size": st.sampled_from([1, 3, 64, 0]),
    "attention_dropout": st.sampled_from([0.0, 0.5, 1.0, -0.1]),
}


@st.composite
def config_kwargs(draw):
    return {name: draw(strategy) for name, strategy in FIELD_VALUES.items() if draw(st.booleans())}


def _names_an_argument(error: Exception, names) -> bool:
    message = str(error)
    return any(re.search(rf"`?{re.escape(name)}`?", message) for name in names)


@SETTINGS
@given(config_kwargs())
def test_config_builds_or_names_the_field(kwargs):
    CASES["config"] += 1
    try:
        config = AoTConfig(**kwargs)
    except (StrictDataclassError, ValueError, TypeError, RuntimeError) as error:  # RuntimeError: `_check_values`
        CASES["errors"] += 1
        assert _names_an_argument(error, kwargs), f"{error!r} names none of {sorted(kwargs)}"
        return
    for name, value in kwargs.items():
        if isinstance(value, float) and math.isnan(value):
            pytest.fail(f"NaN accepted for {name}")
    assert config.hidden_size % config.num_attention_heads == 0


def _valid_text_config(draw) -> AoTConfig:
    heads = draw(st.sampled_from([1, 2, 4]))
    return AoTConfig(
        vocab_size=draw(st.integers(3, 40)),
        hidden_size=heads * draw(st.sampled_from([2, 4, 8])),
        num_attention_heads=heads,
        num_hidden_layers=draw(st.integers(1, 2)),
        max_position_embeddings=draw(st.integers(2, 24)),
        attention_type=draw(st.sampled_from(["mssa", "mhsa"])),
        knn_k=draw(st.one_of(st.none(), st.integers(1, 30), st.floats(0.01, 1.0))),
        knn_chunk_size=draw(st.integers(1, 16)),
        normalize_query=draw(st.booleans()),
        step_size=draw(st.floats(0.01, 2.0)),
        layer_norm=draw(st.booleans()),
        mlp_layers=draw(st.sampled_from(["none", "first_half", "all"])),
    )


@SETTINGS
@given(st.data())
def test_text_model_boundary(data):
    CASES["text"] += 1
    config = _valid_text_config(data.draw)
    model = AoTForCausalLM(config).eval()
    dtype = data.draw(st.sampled_from([torch.float32, torch.bfloat16]))
    model.to(dtype)
    batch = data.draw(st.integers(1, 3))
    length = data.draw(st.integers(1, config.max_position_embeddings + 3))
    high = data.draw(st.sampled_from([config.vocab_size, config.vocab_size + 5]))
    ids = torch.randint(0, high, (batch, length))
    if data.draw(st.booleans()):
        ids[0, 0] = -1 if data.draw(st.booleans()) else ids[0, 0]
    mask = None
    if data.draw(st.booleans()):
        lengths = [data.draw(st.integers(0, length)) for _ in range(batch)]
        left = data.draw(st.booleans())
        mask = torch.zeros(batch, length, dtype=torch.long)
        for row, n in enumerate(lengths):
            if left:
                mask[row, length - n :] = 1
            else:
                mask[row, :n] = 1
    try:
        with torch.no_grad():
            out = model(ids, attention_mask=mask, output_attentions=data.draw(st.booleans()))
    except (ValueError, TypeError, RuntimeError) as error:  # RuntimeError: `_check_values`, on the device's time
        CASES["errors"] += 1
        assert _names_an_argument(error, ["input_ids", "max_position_embeddings", "attention_mask"]), repr(error)
        return
    assert out.logits.shape == (batch, length, config.vocab_size)
    assert torch.isfinite(out.logits).all()


@SETTINGS
@given(st.data())
def test_vision_model_boundary(data):
    CASES["vision"] += 1
    heads = data.draw(st.sampled_from([1, 2]))
    patch = data.draw(st.sampled_from([2, 4]))
    config = AoTConfig(
        hidden_size=4 * heads,
        num_attention_heads=heads,
        num_hidden_layers=1,
        image_size=patch * data.draw(st.integers(1, 4)),
        patch_size=patch,
        num_channels=data.draw(st.sampled_from([1, 3])),
        num_labels=data.draw(st.integers(2, 5)),
        knn_k=data.draw(st.one_of(st.none(), st.integers(1, 20), st.floats(0.05, 1.0))),
        layer_norm=data.draw(st.booleans()),
        pooling=data.draw(st.sampled_from(["cls", "mean"])),
    )
    model = AoTForImageClassification(config).eval()
    dtype = data.draw(st.sampled_from([torch.float32, torch.bfloat16]))
    model.to(dtype)
    channels = data.draw(st.sampled_from([config.num_channels, 1, 3, 4]))
    size = data.draw(st.sampled_from([config.image_size, config.image_size + patch, patch]))
    pixels = torch.randn(data.draw(st.integers(1, 3)), channels, size, size, dtype=dtype)
    if data.draw(st.booleans()):
        pixels = pixels * 1e4  # large but finite inputs
    labels = torch.randint(0, config.num_labels + data.draw(st.integers(0, 2)), (pixels.shape[0],))
    try:
        with torch.no_grad():
            out = model(pixels, labels=labels)
    except (ValueError, TypeError, RuntimeError) as error:  # RuntimeError: `_check_values`, on the device's time
        CASES["errors"] += 1
        assert _names_an_argument(error, ["pixel_values", "labels", "num_channels", "image_size"]), repr(error)
        return
    assert torch.isfinite(out.logits).all() and torch.isfinite(out.loss)


def test_report_cases_tried():
    tried = CASES["config"] + CASES["text"] + CASES["vision"]
    print(f"\nhypothesis cases tried: {CASES} (total {tried})")
    assert tried == 0 or tried >= 3 * 50
