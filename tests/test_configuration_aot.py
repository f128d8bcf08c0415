"""AoTConfig: validation of every field, round trips, presets."""

from __future__ import annotations

import pytest
from huggingface_hub.errors import StrictDataclassError

from aot_transformers import AoTConfig, AoTForCausalLM, list_presets
from aot_transformers.presets import PRESETS
from support import tiny_config


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        (dict(hidden_size=30, num_attention_heads=4), "hidden_size"),
        (dict(knn_k=0), "knn_k"),
        (dict(knn_k=-3), "knn_k"),
        (dict(knn_k=0.0), "knn_k"),
        (dict(knn_k=1.5), "knn_k"),
        (dict(step_size=0.0), "step_size"),
        (dict(step_size=-1.0), "step_size"),
        (dict(step_size=float("nan")), "step_size"),
        (dict(image_size=30, patch_size=4), "image_size"),
        (dict(num_hidden_layers=0), "num_hidden_layers"),
        (dict(vocab_size=0), "vocab_size"),
        (dict(max_position_embeddings=0), "max_position_embeddings"),
        (dict(mlp_ratio=0), "mlp_ratio"),
        (dict(attention_dropout=1.0), "attention_dropout"),
        (dict(hidden_dropout=-0.1), "hidden_dropout"),
        (dict(layer_norm_eps=0.0), "layer_norm_eps"),
        (dict(mlp_ratio=float("inf")), "mlp_ratio"),
        (dict(hidden_act="nope"), "hidden_act"),
        (dict(knn_chunk_size=0), "knn_chunk_size"),
        (dict(pad_token_id=97), "pad_token_id"),
        (dict(num_channels=0), "num_channels"),
    ],
)
def test_invalid_value_raises_value_error_naming_field(overrides, field):
    with pytest.raises(StrictDataclassError, match=field) as error:  # transformers' typed configs raise so
        tiny_config(**overrides)
    assert isinstance(error.value.__cause__, ValueError)


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        (dict(hidden_size="32"), "hidden_size"),
        (dict(knn_k="8"), "knn_k"),
        (dict(knn_k=True), "knn_k"),
        (dict(layer_norm="yes"), "layer_norm"),
        (dict(normalize_query=1), "normalize_query"),
        (dict(num_hidden_layers=2.0), "num_hidden_layers"),
        (dict(step_size="1.0"), "step_size"),
    ],
)
def test_wrong_type_raises_type_error_naming_field(overrides, field):
    with pytest.raises(StrictDataclassError, match=field) as error:
        tiny_config(**overrides)
    assert isinstance(error.value.__cause__, TypeError)


@pytest.mark.parametrize(
    ("field", "value", "allowed"),
    [("attention_type", "bogus", "'mssa', 'mhsa'"), ("mlp_layers", "some", "'none', 'first_half', 'all'"),
     ("pooling", "max", "'cls', 'mean'"), ("mlp_type", "moe", "'mlp', 'ista'")],
)  # fmt: skip
def test_error_message_lists_allowed_values(field, value, allowed):
    with pytest.raises(StrictDataclassError, match=f"'{field}' expected one of \\({allowed}\\), got {value}"):
        tiny_config(**{field: value})


def test_a_field_is_checked_whenever_it_is_set_and_its_agreement_with_others_by_validate():
    config = tiny_config()
    with pytest.raises(StrictDataclassError, match="knn_k"):
        config.knn_k = 0
    assert config.knn_k is None
    config.num_attention_heads = 5  # each field alone is valid; together they are not
    with pytest.raises(StrictDataclassError, match="divisible by `num_attention_heads`"):
        config.validate()
    with pytest.raises(StrictDataclassError, match="divisible"):
        AoTForCausalLM(config)


def test_whole_numbers_are_accepted_where_a_float_is_expected():
    config = tiny_config(step_size=1, hidden_dropout=0, layer_norm_eps=1)
    assert (config.step_size, config.hidden_dropout, config.layer_norm_eps) == (1, 0, 1)


@pytest.mark.parametrize("knn_k", [None, 1, 7, 0.5, 1.0])
def test_valid_knn_k(knn_k):
    assert tiny_config(knn_k=knn_k).knn_k == knn_k


def test_save_load_round_trip(tmp_path):
    config = tiny_config(knn_k=0.25, step_size=0.5, layer_norm=False, mlp_layers="first_half", pooling="mean")
    config.save_pretrained(tmp_path)
    loaded = AoTConfig.from_pretrained(tmp_path)
    for field in ("knn_k", "step_size", "layer_norm", "mlp_layers", "pooling", "hidden_size", "num_labels"):
        assert getattr(loaded, field) == getattr(config, field)


def test_loading_invalid_json_raises(tmp_path):
    tiny_config().save_pretrained(tmp_path)
    path = tmp_path / "config.json"
    path.write_text(path.read_text().replace('"attention_type": "mssa"', '"attention_type": "quantum"'))
    with pytest.raises(StrictDataclassError, match="attention_type"):
        AoTConfig.from_pretrained(tmp_path)


def test_derived_values():
    config = tiny_config(hidden_size=48, num_attention_heads=6, image_size=32, patch_size=8, mlp_ratio=2.0)
    assert config.head_dim == 8
    assert config.num_patches == 16
    assert config.intermediate_size == 96


@pytest.mark.parametrize(
    ("mlp_layers", "expected"), [("none", [0, 0, 0, 0]), ("first_half", [1, 1, 0, 0]), ("all", [1, 1, 1, 1])]
)
def test_mlp_layer_placement(mlp_layers, expected):
    config = tiny_config(num_hidden_layers=4, mlp_layers=mlp_layers)
    assert [int(config.layer_has_mlp(i)) for i in range(4)] == expected


def test_presets_listed_and_buildable():
    names = list_presets()
    for required in (
        "aot-mssa-l-base",
        "aot-mssa-l-medium",
        "aot-mssa-l-large",
        "aot-mhsa-l-base",
        "aot-v-base",
        "aot-v-large",
        "aot-v-huge",
    ):
        assert required in names
    assert names == sorted(PRESETS)
    config = AoTConfig.from_preset("aot-mssa-l-tiny", num_hidden_layers=3)
    assert config.num_hidden_layers == 3 and config.normalize_query


def test_unknown_preset_lists_presets():
    with pytest.raises(ValueError, match="aot-mssa-l-base"):
        AoTConfig.from_preset("gpt-5")


def test_preset_override_is_validated():
    with pytest.raises(StrictDataclassError, match="knn_k"):
        AoTConfig.from_preset("aot-mssa-l-tiny", knn_k=0)
