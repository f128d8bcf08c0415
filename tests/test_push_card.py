"""transformers' own `model.push_to_hub` publishes the AoT model card (metadata the Hub validates) in place of its
blank template, and keeps a card the repository already has."""

from __future__ import annotations

import huggingface_hub
import pytest
import transformers.utils.hub as transformers_hub
import yaml
from huggingface_hub import ModelCard
from huggingface_hub.errors import EntryNotFoundError

from aot_transformers import AoTForCausalLM, AoTForImageClassification
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
