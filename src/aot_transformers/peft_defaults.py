"""AoT's default LoRA target modules in PEFT's table, so `LoraConfig(task_type="CAUSAL_LM")` needs no
`target_modules` for an AoT model.

PEFT looks defaults up by `config.model_type` (`TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING["aot"]`), one
list for every model of that type, and a name in the list that matches no module is skipped as long as one matches.
So one union list serves both variants: MSSA adapts `subspace_proj` (query = key = value) and `o_proj`, MHSA
`q_proj`, `k_proj`, `v_proj` and `o_proj`, and a tied output projection (`tie_output_projection=True`, no `o_proj`)
adapts `subspace_proj` alone. `import aot_transformers` calls `register()` when peft is installed; a folder loaded
through remote code alone does not, and its model card names the modules to pass.
"""

from __future__ import annotations

MODEL_TYPE = "aot"
# MSSA's projections, then MHSA's; `o_proj` is in both.
LORA_TARGET_MODULES = ["subspace_proj", "q_proj", "k_proj", "v_proj", "o_proj"]


def register() -> None:
    """Add AoT's default target modules to PEFT's LoRA table (an entry already there is kept; without peft: none)."""
    try:
        from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING
    except ImportError:  # not installed, or set to None in sys.modules
        return
    TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING.setdefault(MODEL_TYPE, list(LORA_TARGET_MODULES))
