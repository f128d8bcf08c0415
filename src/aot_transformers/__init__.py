"""aot-transformers: attention-only transformers (AoT), k-NN attention and attention-based clustering as
Hugging Face models.

Importing the package registers `AoTConfig` and the model classes with transformers' Auto classes, so
`AutoModelForCausalLM.from_config(AoTConfig(...))` works; saved folders also load without this package through
`trust_remote_code=True`.
"""

import transformers

# shared_projection registers MSSA's CPU training backend, knn the chunked k-NN kernel (`attn_implementation="knn"`)
from . import shared_projection  # noqa: F401
from .configuration_aot import AoTConfig
from .hub import export_model
from .knn import knn_attention_forward
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

transformers.AutoConfig.register("aot", AoTConfig, exist_ok=True)
AoTConfig.register_for_auto_class()  # `save_pretrained` copies the code files with the config
# Each Auto class and what it builds; AutoModel picks the backbone by the checkpoint's `architectures` (a vision
# checkpoint lists AoTVisionModel), and each model writes the `auto_map` of its checkpoint kind when saved.
for _auto, _classes in (
    ("AutoModel", (AoTModel, AoTVisionModel)),
    ("AutoModelForCausalLM", (AoTForCausalLM,)),
    ("AutoModelForSequenceClassification", (AoTForSequenceClassification,)),
    ("AutoModelForTokenClassification", (AoTForTokenClassification,)),
    ("AutoModelForImageClassification", (AoTForImageClassification,)),
):
    getattr(transformers, _auto).register(AoTConfig, _classes if len(_classes) > 1 else _classes[0], exist_ok=True)
    for _cls in _classes:
        _cls.register_for_auto_class(_auto)


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
