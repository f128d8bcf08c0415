"""The suite's fixtures: a seed and thread count per test, one thread for modules of tiny tensors, the shared data.
Helpers are in support.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from support import SHARED_DATA


@pytest.fixture(autouse=True)
def _seed_and_threads():
    """Seed every test, and undo any change a test makes to torch's thread count."""
    torch.manual_seed(0)
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread for a module of tiny tensors, where more threads oversubscribe a shared CPU; a module opts in
    with `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture
def shared_data() -> Path:
    if not SHARED_DATA.exists():
        pytest.skip(f"shared data not found at {SHARED_DATA}")
    return SHARED_DATA
