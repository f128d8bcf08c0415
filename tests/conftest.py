"""Shared test helpers: tiny configs and the location of the shared data."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from aot_transformers import AoTConfig

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("AOT_SHARED_DATA", REPO_ROOT.parent / "shared" / "data"))


def tiny_config(**overrides) -> AoTConfig:
    """A small text config (fast on CPU); any field can be overridden."""
    fields = dict(
        vocab_size=97,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=64,
        image_size=16,
        patch_size=4,
        num_channels=3,
        num_labels=5,
    )
    fields.update(overrides)
    return AoTConfig(**fields)


@pytest.fixture(autouse=True)
def _seed_and_threads():
    """Seed every test, and undo any change a test makes to torch's thread count."""
    torch.manual_seed(0)
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def shared_data() -> Path:
    if not SHARED_DATA.exists():
        pytest.skip(f"shared data not found at {SHARED_DATA}")
    return SHARED_DATA
