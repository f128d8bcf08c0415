"""torch.export with a dynamic batch and sequence length: one program serves every shape and equals eager."""

from __future__ import annotations

import copy

import pytest
import torch
from torch.export import Dim
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from aot_transformers import AoTForCausalLM, AoTForImageClassification, AoTModel, modeling_aot
from aot_transformers.attention_aot import resolve_knn_k
from aot_transformers.graph_export import GraphExportError, export_program
from support import tiny_config

MAX_POSITIONS = 24  # the longest sequence a program is run at: `max_position_embeddings`
# (batch, length) the programs run at, none of them the (2, 8) they were exported with; 1 token and full length too.
TEXT_SHAPES = [(1, 1), (3, 5), (4, 17), (2, MAX_POSITIONS)]


def _text_inputs(batch: int, length: int, with_mask: bool) -> dict:
    inputs = {"input_ids": torch.randint(0, 97, (batch, length)), "use_cache": False}
    if with_mask:
        mask = torch.ones(batch, length, dtype=torch.long)
        mask[0, : length // 2] = 0  # left padding in the first row
        inputs["attention_mask"] = mask
    return inputs


def _export_text(model: torch.nn.Module, with_mask: bool) -> torch.export.ExportedProgram:
    """Export as a user would: the model itself, keyword inputs, `Dim`s for batch and sequence."""
    batch, sequence = Dim("batch"), Dim("sequence", max=MAX_POSITIONS)
    dynamic_shapes = {"input_ids": {0: batch, 1: sequence}, "use_cache": None}
    if with_mask:
        dynamic_shapes["attention_mask"] = {0: batch, 1: sequence}
    with torch.no_grad():
        return torch.export.export(model, (), _text_inputs(2, 8, with_mask), dynamic_shapes=dynamic_shapes)


def _assert_program_equals_eager(model, program, with_mask: bool, key: str) -> None:
    for batch, length in TEXT_SHAPES:
        inputs = _text_inputs(batch, length, with_mask)
        with torch.no_grad():
            expected = model(**inputs)[key]
        actual = program.module()(**inputs)[key]
        assert actual.shape == expected.shape
        torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5, msg=f"batch {batch}, length {length}")


# The LM in both attention types with and without a padding mask; the backbone once each way.
TEXT_CASES = [
    (AoTForCausalLM, "mssa", False),
    (AoTForCausalLM, "mssa", True),
    (AoTForCausalLM, "mhsa", False),
    (AoTForCausalLM, "mhsa", True),
    (AoTModel, "mssa", False),
    (AoTModel, "mhsa", True),
]


@pytest.mark.parametrize(
    "cls, attention_type, with_mask",
    TEXT_CASES,
    ids=[f"{c.__name__}-{a}-{'mask' if m else 'no-mask'}" for c, a, m in TEXT_CASES],
)
def test_exported_text_model_runs_at_every_batch_and_length(cls, attention_type, with_mask):
    model = cls(tiny_config(attention_type=attention_type, max_position_embeddings=MAX_POSITIONS)).eval()
    program = _export_text(model, with_mask)
    # Two free symbols (batch, sequence), none pinned to a value: nothing specialised on the example's shape.
    assert len(program.range_constraints) == 2
    assert all(r.lower < r.upper for r in program.range_constraints.values())
    key = "logits" if cls is AoTForCausalLM else "last_hidden_state"
    _assert_program_equals_eager(model, program, with_mask, key)


@pytest.mark.parametrize("attention_type", ["mssa", "mhsa"])
def test_exported_image_classifier_runs_at_every_batch(attention_type):
    model = AoTForImageClassification(tiny_config(attention_type=attention_type)).eval()
    with torch.no_grad():
        program = torch.export.export(
            model, (), {"pixel_values": torch.randn(2, 3, 16, 16)}, dynamic_shapes={"pixel_values": {0: Dim("batch")}}
        )
    for batch in (1, 3, 7):
        pixel_values = torch.randn(batch, 3, 16, 16)
        with torch.no_grad():
            expected = model(pixel_values=pixel_values).logits
        torch.testing.assert_close(program.module()(pixel_values=pixel_values).logits, expected, atol=1e-5, rtol=1e-5)


def test_export_program_gives_tensor_logits_for_text_and_images():
    lm = AoTForCausalLM(tiny_config(max_position_embeddings=MAX_POSITIONS))
    program = export_program(lm)
    assert not lm.training  # exported as an inference graph
    inputs = _text_inputs(3, 11, with_mask=True)
    del inputs["use_cache"]
    with torch.no_grad():
        expected = lm(**inputs).logits
    torch.testing.assert_close(program.module()(**inputs), expected, atol=1e-5, rtol=1e-5)

    classifier = AoTForImageClassification(tiny_config())
    program = export_program(classifier)
    pixel_values = torch.randn(5, 3, 16, 16)
    with torch.no_grad():
        expected = classifier(pixel_values=pixel_values).logits
    torch.testing.assert_close(program.module()(pixel_values=pixel_values), expected, atol=1e-5, rtol=1e-5)


def test_export_program_rejects_unsupported_models_and_examples():
    with pytest.raises(GraphExportError, match="AoTForCausalLM, AoTModel and AoTForImageClassification"):
        export_program(torch.nn.Linear(2, 2))
    with pytest.raises(GraphExportError, match="at least 2"):
        export_program(AoTForCausalLM(tiny_config()), batch_size=1)
    with pytest.raises(GraphExportError, match=r"max_position_embeddings=64\], got 65"):
        export_program(AoTForCausalLM(tiny_config()), sequence_length=65)


# k-NN models: under torch.export the kernel runs in one piece, with a sort instead of a length-sized top-k.

# Every attention type, k as an int and as a fraction, with and without a padding mask, in four exports.
KNN_CASES = [("mssa", 3, False), ("mhsa", 3, True), ("mssa", 0.5, True), ("mhsa", 0.5, False)]


@pytest.mark.parametrize(
    "attention_type, knn_k, with_mask",
    KNN_CASES,
    ids=[f"{a}-k{k}-{'mask' if m else 'no-mask'}" for a, k, m in KNN_CASES],
)
def test_exported_knn_model_runs_at_every_batch_and_length(attention_type, knn_k, with_mask):
    config = tiny_config(attention_type=attention_type, knn_k=knn_k, max_position_embeddings=MAX_POSITIONS)
    model = AoTForCausalLM(config).eval()
    program = _export_text(model, with_mask)
    _assert_program_equals_eager(model, program, with_mask, "logits")


def _dense_topk_attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    """k-NN attention written without any Python on the shapes: every query keeps the scores at or above its k-th
    best visible score (the k-th found by a sort and a gather at a tensor index, so k stays data, not a guard)."""
    scores = torch.matmul(query, key.transpose(-1, -2)) * scaling  # (B, H, Tq, Tk)
    mask = torch.ones_like(scores, dtype=torch.bool) if attention_mask is None else attention_mask.expand_as(scores)
    mask = mask | ~mask.any(dim=-1, keepdim=True)  # padding queries see every key, as in the package's kernels
    scores = scores.masked_fill(~mask, float("-inf"))
    keep = resolve_knn_k(module.config.knn_k, mask.sum(-1, keepdim=True))  # (B, H, Tq, 1)
    threshold = scores.sort(dim=-1, descending=True).values.gather(-1, keep - 1)
    weights = torch.softmax(scores.masked_fill(scores < threshold, float("-inf")), dim=-1)
    return torch.matmul(weights, value).transpose(1, 2).contiguous(), None


@pytest.fixture
def dense_topk_backend(monkeypatch):
    AttentionInterface.register("dense_topk_probe", _dense_topk_attention)
    AttentionMaskInterface.register("dense_topk_probe", sdpa_mask)
    # A k-NN kernel of its own: the allow-list of backends that honour `knn_k` admits it.
    monkeypatch.setattr(modeling_aot, "KNN_BACKENDS", (*modeling_aot.KNN_BACKENDS, "dense_topk_probe"))
    yield "dense_topk_probe"


@pytest.mark.parametrize("attention_type, knn_k", [("mssa", 3), ("mhsa", 0.5)], ids=["mssa-k3", "mhsa-k0.5"])
def test_knn_model_export_path_has_no_length_specialisation(dense_topk_backend, attention_type, knn_k):
    """Everything of a k-NN model but its kernel (embeddings, positions, the causal and padding mask, the dispatch
    with `knn_k` set) exports with a dynamic batch and length: with a shape-free top-k kernel in place of the
    chunked one, the program equals the eager model with its own k-NN kernel."""
    config = tiny_config(attention_type=attention_type, knn_k=knn_k, max_position_embeddings=MAX_POSITIONS)
    model = AoTForCausalLM(config).eval()
    probe = AoTForCausalLM(copy.deepcopy(config)).eval()  # its own config: the backend is a config field
    probe.load_state_dict(model.state_dict())
    probe.set_attn_implementation(dense_topk_backend)
    program = _export_text(probe, with_mask=True)
    assert all(r.lower < r.upper for r in program.range_constraints.values())
    for batch, length in TEXT_SHAPES:
        inputs = _text_inputs(batch, length, with_mask=True)
        real = inputs["attention_mask"].bool()
        with torch.no_grad():
            expected = model(**inputs).logits  # the real k-NN kernel, eager
        actual = program.module()(**inputs).logits
        torch.testing.assert_close(actual[real], expected[real], atol=1e-5, rtol=1e-5)


# Cached decoding through transformers' own ExecuTorch recipe (a StaticCache inside the exported program).


@pytest.mark.parametrize(
    "attention_type",
    [
        "mssa",
        "mhsa",
    ],
)
def test_executorch_recipe_decoding_gives_the_uncached_logits(attention_type):
    from transformers import GenerationConfig
    from transformers.integrations.executorch import TorchExportableModuleForDecoderOnlyLM

    model = AoTForCausalLM(tiny_config(attention_type=attention_type)).eval()
    model.generation_config = GenerationConfig(
        use_cache=True, cache_implementation="static", cache_config={"batch_size": 1, "max_cache_len": 32}
    )
    recipe = TorchExportableModuleForDecoderOnlyLM(model, batch_size=1, max_cache_len=32)
    step = recipe.export(input_ids=torch.tensor([[1]]), cache_position=torch.tensor([0])).module()
    sequence = [5, 17, 42, *torch.randint(2, 97, (8,)).tolist()]  # a prompt, then 8 decoding steps
    logits = [
        step(input_ids=torch.tensor([[token]]), cache_position=torch.tensor([position]))[0, -1]
        for position, token in enumerate(sequence)
    ]
    with torch.no_grad():
        expected = model(torch.tensor([sequence]), use_cache=False).logits[0]
    # By value at every position (the exported program's StaticCache against no cache), not by greedy tokens.
    torch.testing.assert_close(torch.stack(logits), expected, atol=1e-5, rtol=0)
