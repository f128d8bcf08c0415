"""PEFT's default LoRA targets for AoT: `LoraConfig(task_type=...)` with no `target_modules` adapts the attention
projections of MSSA and MHSA models built once peft is imported, from the package or from a saved folder alone; the
package imports without peft, and does not import it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from aot_transformers import AoTConfig, AoTForCausalLM, AoTForSequenceClassification
from support import REPO_ROOT, char_tokenizer, save_model, tiny_aot

peft = pytest.importorskip("peft")

EXPECTED = {
    ("mssa", False): {"subspace_proj", "o_proj"},
    ("mssa", True): {"subspace_proj"},  # tied output projection: no o_proj
    ("mhsa", False): {"q_proj", "k_proj", "v_proj", "o_proj"},
}


def _adapted(model) -> set[str]:
    """The names of the modules that carry LoRA weights."""
    return {name.rsplit(".", 1)[-1] for name, module in model.named_modules() if hasattr(module, "lora_A")}


@pytest.mark.parametrize(("attention_type", "tied"), list(EXPECTED))
def test_lora_without_target_modules_trains_the_attention_projections(attention_type, tied):
    config = AoTConfig.from_preset(f"aot-{attention_type}-l-tiny", tie_output_projection=tied)
    model = peft.get_peft_model(AoTForCausalLM(config), peft.LoraConfig(task_type="CAUSAL_LM", r=4))
    assert _adapted(model) == EXPECTED[attention_type, tied]
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in name for name in trainable)
    assert len(trainable) == 2 * config.num_hidden_layers * len(EXPECTED[attention_type, tied])  # lora_A, lora_B

    ids = torch.randint(0, config.vocab_size, (2, 12))
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    changed = {name for name, p in model.named_parameters() if not torch.equal(p, before[name])}
    assert changed and changed <= trainable  # only adapters move; lora_B starts at zero, so lora_A moves next step
    assert any("lora_B" in name for name in changed)


def test_sequence_classification_too():
    config = AoTConfig.from_preset("aot-mhsa-l-tiny", num_labels=3, pad_token_id=0)
    model = peft.get_peft_model(AoTForSequenceClassification(config), peft.LoraConfig(task_type="SEQ_CLS", r=4))
    assert _adapted(model) == EXPECTED["mhsa", False]


def _run(code: str, *args: str, **env: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT / "src"), **env}
    result = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout.strip()


def test_the_package_does_not_import_peft():  # so it imports without peft too
    assert _run("import sys, aot_transformers; print('peft' in sys.modules)") == "False"


# A fresh interpreter where `import aot_transformers` fails: the saved folder's own code meets PEFT.
LORA_WITHOUT_PACKAGE = """
import sys
sys.modules["aot_transformers"] = None  # as where the package is not installed
import peft
from transformers import AutoModelForCausalLM

model = AutoModelForCausalLM.from_pretrained(sys.argv[1], trust_remote_code=True)
assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
model = peft.get_peft_model(model, peft.LoraConfig(task_type="CAUSAL_LM", r=4))
print(sorted({name.rsplit(".", 1)[-1] for name, module in model.named_modules() if hasattr(module, "lora_A")}))
"""


@pytest.mark.parametrize("attention_type", ["mssa", "mhsa"])
def test_peft_finds_the_targets_of_a_folder_loaded_without_the_package(tmp_path, attention_type):
    folder = save_model(tiny_aot(attention_type=attention_type), char_tokenizer(), tmp_path / "model")
    adapted = _run(LORA_WITHOUT_PACKAGE, str(folder), HF_MODULES_CACHE=str(tmp_path / "modules"))
    assert adapted == str(sorted(EXPECTED[attention_type, False]))


def test_the_union_is_the_training_defaults():
    from aot_transformers.modeling_aot import LORA_TARGET_MODULES

    lora = pytest.importorskip("aot_transformers.training.lora")
    assert set(LORA_TARGET_MODULES) == {name for names in lora.DEFAULT_TARGETS.values() for name in names}
