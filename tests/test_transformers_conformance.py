"""transformers' own common model tests (`ModelTesterMixin`, `ConfigTester`) over every AoT class.

The mixins are the ones transformers runs on each of its models (see its `tests/models/gpt2/test_modeling_gpt2.py`
and `tests/models/vit/test_modeling_vit.py`); they come from the sdist of the installed transformers version,
fetched once and cached (`tests/transformers_common_tests.py`). Each attention variant (MSSA, MHSA, k-NN) gets a
text test case (`AoTModel`, `AoTForCausalLM`, `AoTForSequenceClassification`, `AoTForTokenClassification`) and a
vision test case (`AoTVisionModel`, `AoTForImageClassification`), with tiny configs built by a `ModelTester`.

Not run, because the sdist does not ship them: `GenerationTesterMixin` (tests/generation/test_utils.py) and
`ExportTesterMixin` (tests/exporters/test_export.py); generation and export are covered by
`tests/test_modeling_aot.py` and `tests/test_export.py`. Every skipped common test below names its reason.
"""

from __future__ import annotations

import contextlib
import inspect
import types
import unittest
from unittest import mock

import pytest
from parameterized import parameterized
from torch import nn
from transformers.models.auto import modeling_auto

from aot_transformers import (
    AoTConfig,
    AoTForCausalLM,
    AoTForImageClassification,
    AoTForSequenceClassification,
    AoTForTokenClassification,
    AoTModel,
    AoTPreTrainedModel,
    AoTVisionModel,
)
from transformers_common_tests import CommonTestsUnavailable, is_stand_in, load_common_tests

try:
    _suite = load_common_tests()
except CommonTestsUnavailable as error:
    pytest.skip(f"transformers' common model tests could not be fetched from PyPI: {error}", allow_module_level=True)

_modeling = _suite["modeling"]
ModelTesterMixin = _modeling.ModelTesterMixin
ConfigTester = _suite["configuration"].ConfigTester
ids_tensor, floats_tensor, random_attention_mask = (
    _modeling.ids_tensor,
    _modeling.floats_tensor,
    _modeling.random_attention_mask,
)
SDPA_PARAMETERIZATION = _modeling.TEST_EAGER_MATCHES_SDPA_INFERENCE_PARAMETERIZATION
GENERATION_MIXIN_SHIPPED = not is_stand_in(_suite["generation"])

# The class names transformers' static Auto tables would hold if AoT lived inside transformers: the mixins read
# them to decide which class is a base model, which takes sequence labels and which takes token labels.
AUTO_NAMES = {
    "MODEL_MAPPING_NAMES": ("AoTModel", "AoTVisionModel"),
    "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES": "AoTForCausalLM",
    "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES": "AoTForSequenceClassification",
    "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES": "AoTForTokenClassification",
    "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES": "AoTForImageClassification",
}

VARIANTS = {
    "mssa": dict(attention_type="mssa"),
    "mhsa": dict(attention_type="mhsa"),
    "knn": dict(attention_type="mssa", knn_k=3),  # 3 of up to 7 text / 17 vision keys: a real top-k selection
}


KNN_DENSE_BACKENDS = (
    "the test compares or switches between the dense backends 'eager' and 'sdpa'; with `knn_k` set both raise a "
    "ValueError by design (they would silently attend to every key instead of the k nearest)"
)


@contextlib.contextmanager
def eager_means_knn():
    """Build k-NN models with the 'knn' backend where a common test asks for 'eager'.

    The common tests ask for 'eager' only because it is the dense backend that returns attention maps; with
    `knn_k` set the 'knn' backend is the one that computes (and returns) them, and 'eager' is refused by design.
    """
    original = AoTPreTrainedModel.get_correct_attn_implementation

    def knn_guard(self, requested_attention, is_init_check=False):
        if requested_attention == "eager" and self.config.knn_k is not None:
            requested_attention = "knn"
        return original(self, requested_attention, is_init_check)

    with mock.patch.object(AoTPreTrainedModel, "get_correct_attn_implementation", knn_guard):
        yield


@contextlib.contextmanager
def heads_annotations_resolved():
    """Let the common tests read the `**kwargs: Unpack[TransformersKwargs]` of the classification heads.

    AoT's heads inherit their forward from transformers' `GenericForSequenceClassification` and
    `GenericForTokenClassification`, as Llama's do; `transformers.modeling_layers` postpones its annotations, so the
    common test's check for `output_attentions` (which reads the annotation's `__args__`) sees a string and skips the
    whole test case, the AoT classes before the heads included. Resolved, the test runs on every class."""
    resolving = types.SimpleNamespace(**vars(inspect))
    resolving.signature = lambda obj, **kwargs: inspect.signature(obj, **{"eval_str": True, **kwargs})
    with mock.patch.object(_modeling, "inspect", resolving):
        yield


class AoTTextModelTester:
    """Tiny text configs and inputs, as `GPT2ModelTester` builds them."""

    def __init__(self, parent, variant: str, batch_size: int = 3, seq_length: int = 7):
        self.parent = parent
        self.variant = variant
        self.batch_size = batch_size
        self.seq_length = seq_length
        self.vocab_size = 99
        self.hidden_size = 32
        self.num_hidden_layers = 2
        self.num_attention_heads = 4
        self.num_labels = 3
        self.is_training = True

    def get_config(self) -> AoTConfig:
        return AoTConfig(
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=self.num_attention_heads,
            max_position_embeddings=64,
            num_labels=self.num_labels,
            # Pad id 0, not GPT-2's `vocab_size - 1`: the common tests shrink `vocab_size` (to 4 and 10) without
            # touching the special ids, and AoTConfig refuses token ids outside the vocabulary.
            pad_token_id=0,
            **VARIANTS[self.variant],
        )

    def prepare_config_and_inputs_for_common(self) -> tuple[AoTConfig, dict]:
        input_ids = ids_tensor([self.batch_size, self.seq_length], self.vocab_size - 1) + 1  # no pad id inside
        attention_mask = random_attention_mask([self.batch_size, self.seq_length])
        return self.get_config(), {"input_ids": input_ids, "attention_mask": attention_mask}


class AoTVisionModelTester:
    """Tiny vision configs and inputs, as `ViTModelTester` builds them."""

    def __init__(self, parent, variant: str, batch_size: int = 3):
        self.parent = parent
        self.variant = variant
        self.batch_size = batch_size
        self.image_size = 16
        self.patch_size = 4
        self.num_channels = 3
        self.hidden_size = 32
        self.num_hidden_layers = 2
        self.num_attention_heads = 4
        self.num_labels = 3
        self.is_training = True
        self.seq_length = (self.image_size // self.patch_size) ** 2 + 1  # patches + CLS token

    def get_config(self) -> AoTConfig:
        return AoTConfig(
            hidden_size=self.hidden_size,
            num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=self.num_attention_heads,
            image_size=self.image_size,
            patch_size=self.patch_size,
            num_channels=self.num_channels,
            num_labels=self.num_labels,
            **VARIANTS[self.variant],
        )

    def prepare_config_and_inputs_for_common(self) -> tuple[AoTConfig, dict]:
        pixel_values = floats_tensor([self.batch_size, self.num_channels, self.image_size, self.image_size])
        return self.get_config(), {"pixel_values": pixel_values}


class _AoTCommonTests(ModelTesterMixin):
    """What every AoT test case shares: the Auto names, the config tests and the documented skips."""

    variant = "mssa"
    model_tester_class = AoTTextModelTester
    has_text_modality = True
    # transformers runs this check only on models it dates to 2023 or later by a "# Copyright <year>" header, which
    # AoT's files do not carry; `_init_weights` must cover every weight, so run it.
    test_can_init_all_missing_weights_before_2023 = True

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls._auto_names = [
            mock.patch.dict(getattr(modeling_auto, table), {"aot": names}) for table, names in AUTO_NAMES.items()
        ]
        for patch in cls._auto_names:
            patch.start()

    @classmethod
    def tearDownClass(cls):
        for patch in cls._auto_names:
            patch.stop()
        super().tearDownClass()

    def setUp(self):
        self.model_tester = self.model_tester_class(self, self.variant)
        self.config_tester = ConfigTester(
            self,
            config_class=AoTConfig,
            has_text_modality=self.has_text_modality,
            # GPT-2's tester passes n_embd=37; AoTConfig checks that the heads divide the width, so 36 with 4 heads.
            hidden_size=36,
            num_attention_heads=4,
        )

    def test_config(self):
        self.config_tester.run_common_tests()

    def test_generation_tester_mixin_inheritance(self):
        if not GENERATION_MIXIN_SHIPPED:
            self.skipTest(
                "GenerationTesterMixin (tests/generation/test_utils.py) is not in the transformers sdist on PyPI; "
                "generation is tested in tests/test_modeling_aot.py"
            )
        super().test_generation_tester_mixin_inheritance()

    def test_resize_position_vector_embeddings(self):
        self.skipTest(
            "AoT, like GPT-2 and ViT, does not implement `resize_position_embeddings` (a learned position table; the "
            "vision models resize it on the fly with `interpolate_pos_encoding=True`)"
        )

    @parameterized.expand(SDPA_PARAMETERIZATION)
    def test_eager_matches_sdpa_inference(self, *args):
        with heads_annotations_resolved():
            try:
                _modeling._test_eager_matches_sdpa_inference(self, *args)
            except unittest.SkipTest as skip:  # every AoT forward takes `**kwargs: Unpack[TransformersKwargs]`
                if "does not support output_attentions" in str(skip):
                    self.fail(f"transformers' common test reads an AoT forward as untyped: {skip}")
                raise

    def test_sdpa_can_dispatch_composite_models(self):
        self.skipTest("AoT models are not composite: one AoTConfig, no sub-configs")

    def test_sdpa_can_dispatch_non_composite_models(self):
        default = self.model_tester.get_config()
        if default.knn_k is not None:
            self.skipTest(
                "the test assumes the default backend is 'sdpa'; by design AoT defaults to 'knn' when `knn_k` is set"
            )
        super().test_sdpa_can_dispatch_non_composite_models()


class _KNNTests:
    """Overrides for the k-NN variants (mixed in before the common tests)."""

    variant = "knn"

    def test_attention_outputs(self):
        with eager_means_knn():
            super().test_attention_outputs()

    def test_retain_grad_hidden_states_attentions(self):
        with eager_means_knn():  # the test asks for eager only to get attention maps, which the k-NN backend returns
            super().test_retain_grad_hidden_states_attentions()

    def test_can_set_attention_dynamically(self):
        self.skipTest(KNN_DENSE_BACKENDS)

    @parameterized.expand(SDPA_PARAMETERIZATION)
    def test_eager_matches_sdpa_inference(self, *args):
        self.skipTest(KNN_DENSE_BACKENDS)


class AoTTextMSSATest(_AoTCommonTests, unittest.TestCase):
    all_model_classes = (AoTModel, AoTForCausalLM, AoTForSequenceClassification, AoTForTokenClassification)


class AoTTextMHSATest(AoTTextMSSATest):
    variant = "mhsa"


class AoTTextKNNTest(_KNNTests, AoTTextMSSATest):
    pass


class AoTVisionMSSATest(_AoTCommonTests, unittest.TestCase):
    all_model_classes = (AoTVisionModel, AoTForImageClassification)
    model_tester_class = AoTVisionModelTester
    has_text_modality = False
    test_resize_embeddings = False  # patch embeddings, no vocabulary (as ViT)

    def test_model_get_set_embeddings(self):
        # As transformers' ViT test: the input embedding of an image model is its patch embedding, not an
        # `nn.Embedding`, and it cannot be swapped for a token embedding.
        config, _ = self.model_tester.prepare_config_and_inputs_for_common()
        for model_class in self.all_model_classes:
            model = model_class(config)
            self.assertIsInstance(model.get_input_embeddings(), nn.Module)
            output_embeddings = model.get_output_embeddings()
            self.assertTrue(output_embeddings is None or isinstance(output_embeddings, nn.Linear))

    def test_enable_input_require_grads_with_gradient_checkpointing(self):
        self.skipTest(
            "the test reads the input embedding's `.weight`; a vision model's input embedding is its patch embedding "
            "(LayerNorm, Linear, LayerNorm, as ViT's), which has no single `.weight`"
        )


class AoTVisionMHSATest(AoTVisionMSSATest):
    variant = "mhsa"


class AoTVisionKNNTest(_KNNTests, AoTVisionMSSATest):
    pass


def test_output_attentions_on_a_knn_config_selects_the_knn_backend():
    """The fix `test_attention_outputs` exposed: transformers' `output_attentions` setter switched a k-NN config to
    'eager' (which a k-NN model refuses) and refused 'knn', whose kernel returns the maps."""
    config = AoTTextModelTester(None, "knn").get_config()
    config.output_attentions = True  # before the model is built: must not switch to a dense backend
    model = AoTModel(config).eval()
    assert model.config._attn_implementation == "knn"
    input_ids = ids_tensor([2, 5], config.vocab_size)
    attentions = model(input_ids).attentions
    assert len(attentions) == config.num_hidden_layers
    assert (attentions[0] > 0).sum(-1).max() <= config.knn_k  # k-NN maps: at most k keys per query
    model.config.output_attentions = False
    model.config.output_attentions = True  # on a built k-NN model too
    with pytest.raises(ValueError, match="needs an attention backend that returns attention maps"):
        AoTModel(AoTTextModelTester(None, "mssa").get_config()).config.output_attentions = True
