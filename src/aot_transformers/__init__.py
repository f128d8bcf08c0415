"""aot-transformers: attention-only transformers (AoT), k-NN attention and attention-based clustering as
Hugging Face models.

Importing the package registers `AoTConfig` and the model classes with transformers' Auto classes, so
`AutoModelForCausalLM.from_config(AoTConfig(...))` works; saved folders also load without this package through
`trust_remote_code=True`.
"""

from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForImageClassification,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
)

from . import peft_defaults, shared_projection  # noqa: F401  (shared_projection registers MSSA's CPU training backend)
from .attention_aot import knn_attention_forward
from .configuration_aot import AoTConfig
from .hub import export_model
from .modeling_aot import (
    AoTForCausalLM,
    AoTForImageClassification,
    AoTForSequenceClassification,
    AoTForTokenClassification,
    AoTModel,
    AoTPreTrainedModel,
    AoTVisionModel,
)
from .presets import list_presets

__version__ = "0.1.0"

AutoConfig.register("aot", AoTConfig, exist_ok=True)
# AutoModel picks the backbone by the checkpoint's `architectures` (a vision checkpoint lists AoTVisionModel).
AutoModel.register(AoTConfig, (AoTModel, AoTVisionModel), exist_ok=True)
AutoModelForCausalLM.register(AoTConfig, AoTForCausalLM, exist_ok=True)
AutoModelForSequenceClassification.register(AoTConfig, AoTForSequenceClassification, exist_ok=True)
AutoModelForTokenClassification.register(AoTConfig, AoTForTokenClassification, exist_ok=True)
AutoModelForImageClassification.register(AoTConfig, AoTForImageClassification, exist_ok=True)

# `save_pretrained` copies the code files with the config; each model writes the `auto_map` of its checkpoint kind.
AoTConfig.register_for_auto_class()
AoTModel.register_for_auto_class("AutoModel")
AoTVisionModel.register_for_auto_class("AutoModel")
AoTForCausalLM.register_for_auto_class("AutoModelForCausalLM")
AoTForSequenceClassification.register_for_auto_class("AutoModelForSequenceClassification")
AoTForTokenClassification.register_for_auto_class("AutoModelForTokenClassification")
AoTForImageClassification.register_for_auto_class("AutoModelForImageClassification")


# PEFT's default LoRA targets for model_type "aot" (`LoraConfig(task_type=...)` without `target_modules`); peft is
# an optional dependency: without it nothing is registered.
peft_defaults.register()

__all__ = [
    "AoTConfig",
    "AoTForCausalLM",
    "AoTForImageClassification",
    "AoTForSequenceClassification",
    "AoTForTokenClassification",
    "AoTModel",
    "AoTPreTrainedModel",
    "AoTVisionModel",
    "export_model",
    "knn_attention_forward",
    "list_presets",
    "__version__",
]
