"""Host syncs (reads of tensor values into Python, which stall an accelerator's queue) per step: the AoT models do
no more than transformers' GPT-2 on the same step, and the k-NN kernel adds at most one per forward.

Counted by `benchmarks.syncs.count_host_syncs` (a `TorchDispatchMode`: what it counts on CPU is what would sync on
a GPU); the models and steps are `benchmarks.bench_syncs`'s (4 layers, hidden 64, 4 heads, vocab 1000; a (2, 32)
batch; a decoding step on a 16-token cache; 16 greedy new tokens). `python -m benchmarks.bench_syncs` prints the
counts of every model and step, with the code line of each sync.
"""

from __future__ import annotations

import functools

import pytest
import torch
from benchmarks.bench_syncs import STEPS, aot, count_step, gpt2
from benchmarks.syncs import count_host_syncs

PRESETS = {"mssa": "aot-mssa-l-tiny", "mhsa": "aot-mhsa-l-tiny"}


def _syncs(model, step: str):
    """The syncs of one call of `step` on `model` (after an uncounted warm-up call), with their code lines."""
    return count_step(STEPS[step](model))


@functools.cache
def _gpt2_syncs(step: str):
    torch.manual_seed(0)
    return _syncs(gpt2(), step)


@functools.cache
def _aot_syncs(attention: str, step: str, **overrides):
    torch.manual_seed(0)
    return _syncs(aot(PRESETS[attention], **overrides), step)


# --- the counter ---------------------------------------------------------------------------------------------------

_VALUES = torch.arange(6.0)
_COUNTED = {
    "int(t.max())": lambda: int(_VALUES.max()),
    "bool(t.any())": lambda: bool((_VALUES > 2).any()),
    "t.nonzero()": lambda: _VALUES.nonzero(),
    "t.item()": lambda: _VALUES.sum().item(),
    "t[bool mask]": lambda: _VALUES[_VALUES > 2],
    "t.tolist()": lambda: _VALUES.tolist(),
}


@pytest.mark.parametrize("read", list(_COUNTED))
def test_counter_counts_each_read_of_a_value_into_python(read):
    with count_host_syncs() as syncs:
        _COUNTED[read]()
    assert syncs.count == 1, syncs
    site = next(iter(syncs.by_site))
    assert "test_host_syncs.py" in site, f"the site names the line that synced, got {site!r}"


def test_counter_ignores_tensor_arithmetic_and_device_side_asserts():
    with count_host_syncs() as syncs:
        scaled = (_VALUES * 2 + 1).softmax(-1).cumsum(-1)
        torch._assert_async((scaled > 0).all())
        torch.topk(scaled, 2)
        _VALUES[torch.tensor([1, 2])]  # integer indices: no sync
    assert syncs.count == 0, syncs


def test_counter_restores_the_tensor_methods_it_wraps():
    with count_host_syncs():
        pass
    assert "tolist" not in torch.Tensor.__dict__ and "numpy" not in torch.Tensor.__dict__
    with count_host_syncs() as syncs:
        pass
    _VALUES.tolist()
    assert syncs.count == 0


# --- dense AoT vs GPT-2 --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("step", ["forward", "forward_mask", "train", "decode"])
@pytest.mark.parametrize("attention", list(PRESETS))
def test_dense_aot_step_syncs_no_more_than_gpt2(attention, step):
    ours, theirs = _aot_syncs(attention, step), _gpt2_syncs(step)
    assert ours.count <= theirs.count, f"aot-{attention}: {ours}\ngpt2: {theirs}"


@pytest.mark.parametrize("attention", list(PRESETS))
def test_dense_aot_greedy_generate_syncs_no_more_than_gpt2(attention):
    ours, theirs = _aot_syncs(attention, "generate"), _gpt2_syncs("generate")
    assert ours.count <= theirs.count, f"aot-{attention}: {ours}\ngpt2: {theirs}"


# --- k-NN attention: at most one sync per forward, not per layer or per chunk --------------------------------------


@pytest.mark.parametrize("step", ["forward", "forward_mask", "train", "decode"])
@pytest.mark.parametrize("knn_k", [8, 0.5], ids=["k8", "k0.5"])
def test_knn_kernel_adds_at_most_one_sync_per_forward(knn_k, step):
    """4 layers, 32 tokens in query chunks of 8: a sync per layer or per chunk would add 4 to 16."""
    dense = _aot_syncs("mssa", step)
    knn = _aot_syncs("mssa", step, knn_k=knn_k, knn_chunk_size=8)
    assert knn.count <= dense.count + 1, f"knn_k={knn_k}: {knn}\ndense: {dense}"
