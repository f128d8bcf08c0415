"""transformers' own `model.push_to_hub` publishes the AoT model card (metadata the Hub validates) in place of its
blank template: the card of the folder the model was loaded from while its weights are that folder's, with the package
or without, else one the package renders; and it keeps a card the repository already has."""

from __future__ import annotations

import os
import subprocess
import sys

import huggingface_hub
import pytest
import torch
import transformers.utils.hub as transformers_hub
import yaml
from huggingface_hub import ModelCard
from huggingface_hub.errors import EntryNotFoundError

from aot_transformers import AoTForCausalLM, AoTForImageClassification, export_model
from aot_transformers.model_card import render_model_card
from support import tiny_config
from test_hub import StandInHub


@pytest.fixture
def hub(monkeypatch):
    server = StandInHub()
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", server.url)
    monkeypatch.setattr(transformers_hub, "_hf_api", huggingface_hub.HfApi(endpoint=server.url))
    yield server
    server.close()


def _repository_has_no_card(monkeypatch):
    def load(repo_id, **kwargs):
        raise EntryNotFoundError(f"{repo_id} has no README.md")

    monkeypatch.setattr(transformers_hub.ModelCard, "load", load)


def _metadata(readme: bytes) -> dict:
    return yaml.safe_load(readme.decode().split("---")[1])


@pytest.mark.parametrize(
    ("model_class", "task"), [(AoTForCausalLM, "text-generation"), (AoTForImageClassification, "image-classification")]
)
def test_model_push_to_hub_publishes_the_aot_card(hub, monkeypatch, model_class, task):
    _repository_has_no_card(monkeypatch)
    model_class(tiny_config()).push_to_hub("someone/tiny", token="hf_test")
    files = hub.committed_files("someone/tiny")
    assert {"config.json", "model.safetensors", "modeling_aot.py", "README.md"} <= set(files)
    metadata = _metadata(files["README.md"])  # the stand-in Hub refused the commit if the metadata were invalid
    assert metadata["license"] == "apache-2.0" and metadata["pipeline_tag"] == task
    assert "aot" in metadata["tags"] and metadata["library_name"] == "transformers"
    assert "automatically generated" not in files["README.md"].decode()
    assert "trust_remote_code=True" in files["README.md"].decode()  # the card's usage section


def test_model_push_to_hub_keeps_the_card_the_repository_has(hub, monkeypatch):
    own = ModelCard("---\nlicense: mit\n---\n# My own card\n")
    monkeypatch.setattr(transformers_hub.ModelCard, "load", lambda repo_id, **kwargs: own)
    AoTForCausalLM(tiny_config()).push_to_hub("someone/tiny", token="hf_test")
    readme = hub.committed_files("someone/tiny")["README.md"].decode()
    assert "# My own card" in readme and _metadata(readme.encode())["license"] == "mit"


def _exported_with_card(tmp_path):
    """A folder as `aot export` writes it, with a card that names the folder's own training run."""
    model = AoTForCausalLM(tiny_config())
    card = render_model_card(model.config, model_name="tiny-from-folder", training={"max_steps": 3})
    return export_model(model, tmp_path / "exported", model_card=card)


def test_a_model_loaded_from_a_folder_pushes_the_folders_card_while_its_weights_are_the_folders(
    hub, monkeypatch, tmp_path
):
    _repository_has_no_card(monkeypatch)
    folder = _exported_with_card(tmp_path)
    model = AoTForCausalLM.from_pretrained(folder)
    model.push_to_hub("someone/as-loaded", token="hf_test")
    assert hub.committed_files("someone/as-loaded")["README.md"] == (folder / "README.md").read_bytes()
    with torch.no_grad():
        model.lm_head.weight.mul_(2.0)  # fine-tuned: the folder's card no longer describes these weights
    model.push_to_hub("someone/changed", token="hf_test")
    readme = hub.committed_files("someone/changed")["README.md"].decode()
    assert "tiny-from-folder" not in readme and "# changed" in readme  # the card the package renders for the push
    assert "trust_remote_code=True" in readme and "automatically generated" not in readme


# Runs in a fresh interpreter where `import aot_transformers` fails: the folder's own code pushes the model.
PUSH_WITHOUT_PACKAGE = """
import sys
sys.modules["aot_transformers"] = None  # as where the package is not installed
import huggingface_hub
import torch
import transformers.utils.hub as transformers_hub
from huggingface_hub.errors import EntryNotFoundError
from transformers import AutoModelForCausalLM

endpoint, folder = sys.argv[1:3]
transformers_hub._hf_api = huggingface_hub.HfApi(endpoint=endpoint)


def load(repo_id, **kwargs):  # the repositories have no card yet
    raise EntryNotFoundError(f"{repo_id} has no README.md")


transformers_hub.ModelCard.load = load
model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)
assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
model.push_to_hub("someone/as-loaded", token="hf_test")
with torch.no_grad():
    model.lm_head.weight.mul_(2.0)
model.push_to_hub("someone/changed", token="hf_test")
"""


def test_a_folder_loaded_without_the_package_pushes_its_card(hub, tmp_path):
    folder = _exported_with_card(tmp_path)
    env = {**os.environ, "HF_ENDPOINT": hub.url, "HF_MODULES_CACHE": str(tmp_path / "modules")}
    command = [sys.executable, "-c", PUSH_WITHOUT_PACKAGE, hub.url, str(folder)]
    result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert hub.committed_files("someone/as-loaded")["README.md"] == (folder / "README.md").read_bytes()
    # Changed weights and no package to render a card for them: transformers' own template, as for any model.
    assert b"automatically generated" in hub.committed_files("someone/changed")["README.md"]
