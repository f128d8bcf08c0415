"""AoT behaves like a transformers model: attention backends through `ALL_ATTENTION_FUNCTIONS`, masks from
`masking_utils` (2-D, 4-D, packed), dynamic/static/paged caches, compiled decoding, every Auto class, the
classification heads and pipelines, `interpolate_pos_encoding`, version and loading hygiene."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch
from benchmarks.cache_paths import MARGIN, PATHS, TOLERANCE, ModelSpec
from transformers import (
    AttentionInterface,
    AutoModel,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
    StaticCache,
    Trainer,
    TrainingArguments,
)
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from aot_transformers import (
    AoTForCausalLM,
    AoTForImageClassification,
    AoTForSequenceClassification,
    AoTForTokenClassification,
    AoTModel,
    AoTVisionModel,
)
from aot_transformers.experiments.subspace import subspace_attention
from support import REPO_ROOT, tiny_config

VARIANTS = {
    "mssa": dict(attention_type="mssa"),
    "mhsa": dict(attention_type="mhsa"),
    "knn": dict(attention_type="mssa", knn_k=3),
    "mssa-normalized": dict(attention_type="mssa", normalize_query=True),
}


def _lm(**overrides) -> AoTForCausalLM:
    return AoTForCausalLM(tiny_config(pad_token_id=0, eos_token_id=1, **overrides)).eval()


def _left_padded(batch=3, length=9):
    ids = torch.randint(2, 97, (batch, length))
    mask = torch.ones_like(ids)
    mask[1, :4] = 0
    mask[2, :2] = 0
    return ids.masked_fill(mask == 0, 0), mask


# --- attention backends ----------------------------------------------------------------------------------------


def test_backend_defaults_follow_the_config_and_switch_at_run_time():
    assert _lm().config._attn_implementation == "sdpa"
    assert _lm(knn_k=3).config._attn_implementation == "knn"
    model = _lm()
    ids = torch.randint(0, 97, (2, 10))
    with torch.no_grad():
        sdpa = model(ids).logits
        model.set_attn_implementation("eager")
        assert model.config._attn_implementation == "eager"
        eager = model(ids, output_attentions=True)
    assert eager.attentions[0].shape == (2, 4, 10, 10)  # the eager backend is really the one running
    torch.testing.assert_close(sdpa, eager.logits, atol=1e-5, rtol=1e-4)
    assert AoTForCausalLM.is_backend_compatible() and AoTForCausalLM._can_set_attn_implementation()


def test_a_user_registered_kernel_is_called_with_the_forward_kwargs():
    calls = []

    def spy(module, query, key, value, attention_mask, **kwargs):
        calls.append((module.layer_idx, kwargs.get("marker")))
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)

    AttentionInterface.register("spy_for_aot_tests", spy)
    AttentionMaskInterface.register("spy_for_aot_tests", sdpa_mask)
    model = _lm()
    ids = torch.randint(0, 97, (2, 8))
    with torch.no_grad():
        expected = model(ids).logits
        model.set_attn_implementation("spy_for_aot_tests")
        got = model(ids, marker="seen").logits
    assert calls == [(0, "seen"), (1, "seen")]  # every layer, with a kwarg passed to the model's forward
    torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("attention_type", ["mssa", "mhsa"])
def test_eager_sdpa_shared_projection_and_large_k_knn_agree_in_values_and_gradients(attention_type):
    ids = torch.randint(0, 97, (2, 20))
    results = {}
    for backend in ("eager", "sdpa", "shared_projection", "knn"):
        config = tiny_config(attention_type=attention_type, knn_k=64 if backend == "knn" else None)
        config._attn_implementation = backend
        torch.manual_seed(0)  # the same weights for every backend
        model = AoTForCausalLM(config).train()  # training mode: the shared-projection kernel runs for MSSA
        loss = model(ids, labels=ids).loss
        loss.backward()
        results[backend] = (loss.detach(), [p.grad for p in model.parameters()])
    for backend in ("sdpa", "shared_projection", "knn"):
        torch.testing.assert_close(results[backend][0], results["eager"][0], atol=1e-5, rtol=1e-5)
        for got, expected in zip(results[backend][1], results["eager"][1], strict=True):
            torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)


def test_knn_k_with_a_dense_backend_is_refused():
    model = _lm(knn_k=3)
    with pytest.raises(ValueError, match="knn_k=3"):
        model.set_attn_implementation("sdpa")
    config = tiny_config(knn_k=0.5)
    config._attn_implementation = "eager"
    with pytest.raises(ValueError, match="attn_implementation='knn'"):
        AoTForCausalLM(config)


def test_functional_operator_keeps_exactly_k_keys_on_ties():
    tokens = torch.ones(1, 6, 4)  # every score ties
    basis = torch.eye(4)[None]  # one head, U = I
    weights = {}

    def capture(scores):
        weights["w"] = torch.softmax(scores, dim=-1)
        return weights["w"]

    subspace_attention(tokens, basis, phi=capture, knn_k=2)
    assert torch.equal((weights["w"] > 0).sum(-1), torch.full((1, 1, 6), 2))


def test_loading_info_is_returned(tmp_path):
    _lm().save_pretrained(tmp_path)
    model, info = AoTForCausalLM.from_pretrained(tmp_path, output_loading_info=True)
    assert isinstance(model, AoTForCausalLM) and info["missing_keys"] == set() or info["missing_keys"] == []


# --- masks --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", ["mssa", "knn"])
def test_a_4d_mask_is_used_as_given(variant):
    model = _lm(**VARIANTS[variant])
    ids, mask = _left_padded()
    length = ids.shape[1]
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    mask_4d = causal[None, None] & mask.bool()[:, None, None, :]  # (B, 1, T, T)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        from_2d = model(ids, attention_mask=mask).logits
        from_4d = model(ids, attention_mask=mask_4d, position_ids=positions).logits
        additive = torch.zeros(mask_4d.shape).masked_fill(~mask_4d, torch.finfo(torch.float32).min)
        from_additive = model(ids, attention_mask=additive, position_ids=positions).logits
    real = mask.bool()
    torch.testing.assert_close(from_4d[real], from_2d[real], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(from_additive[real], from_2d[real], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("variant", ["mssa", "mhsa", "knn"])
def test_packed_sequences_attend_only_within_themselves(variant):
    model = _lm(**VARIANTS[variant])
    first, second = torch.randint(2, 97, (1, 5)), torch.randint(2, 97, (1, 7))
    packed = torch.cat([first, second], dim=1)
    positions = torch.cat([torch.arange(5), torch.arange(7)])[None]  # restart at 0: a new sequence
    with torch.no_grad():
        # Packing is a training-time layout (no cache), as with `DataCollatorWithFlattening`.
        together = model(packed, position_ids=positions, use_cache=False).logits
        alone = torch.cat([model(first).logits, model(second).logits], dim=1)
    torch.testing.assert_close(together, alone, atol=1e-5, rtol=1e-4)


# --- caches -------------------------------------------------------------------------------------------------------


def _assert_generated_logits_equal_unpadded_uncached_forward(model, ids, mask, out) -> None:
    """Each step's logits of a left-padded `generate` equal an uncached forward over that row's real tokens alone
    (prompt without padding + the tokens generated), within float32 round-off."""
    width = ids.shape[1]
    for row in range(ids.shape[0]):
        real = torch.cat([ids[row][mask[row].bool()], out.sequences[row, width:]])[None]
        with torch.no_grad():
            alone = model(real, use_cache=False).logits[0]
        prompt = int(mask[row].sum())
        steps = torch.stack([logits[row] for logits in out.logits])  # (steps, V): step t predicts token prompt + t
        torch.testing.assert_close(steps, alone[prompt - 1 : prompt - 1 + len(steps)], atol=1e-5, rtol=0)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("cache_implementation", ["dynamic", "static"])
def test_static_and_dynamic_cache_generation_give_the_uncached_logits(variant, cache_implementation):
    # By value: an untrained model's greedy tokens agree between caches even with logits 0.3 apart.
    model = _lm(**VARIANTS[variant])
    ids, mask = _left_padded()
    out = model.generate(
        ids,
        attention_mask=mask,
        max_new_tokens=10,
        do_sample=False,
        eos_token_id=None,  # every row generates all 10 tokens
        cache_implementation=cache_implementation,
        output_logits=True,
        return_dict_in_generate=True,
    )
    assert len(out.logits) == 10
    _assert_generated_logits_equal_unpadded_uncached_forward(model, ids, mask, out)


@pytest.mark.parametrize("head", ["lm", "sequence"])
def test_cache_is_named_cache_and_past_key_values_still_works_with_a_deprecation_warning(head):
    # transformers 5.24 renamed `past_key_values` to `cache`; the old name is deprecated as Llama deprecates it.
    model = _lm() if head == "lm" else AoTForSequenceClassification(tiny_config(pad_token_id=0)).eval()
    ids, step = torch.randint(2, 97, (2, 5)), torch.randint(2, 97, (2, 1))
    with torch.no_grad():
        prefix = model(ids, use_cache=True)
        assert prefix.cache is not None and prefix.to_tuple()[1] is prefix.cache
        by_name = {}
        for name in ("cache", "past_key_values"):
            cache = model(ids, use_cache=True).cache
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                by_name[name] = model(step, use_cache=True, **{name: cache}).logits
            assert any("`past_key_values` is deprecated" in str(w.message) for w in caught) == (name != "cache")
            assert model(step, use_cache=True, **{name: cache}).cache.get_seq_length() == 7
        whole = model(torch.cat([ids, step], dim=1)).logits
        torch.testing.assert_close(by_name["cache"], by_name["past_key_values"])
        torch.testing.assert_close(by_name["cache"][:, -1], whole[:, -1], atol=1e-5, rtol=1e-5)
        if head == "lm":  # the heads on transformers' `GenericFor*` resolve the two names as transformers does
            first, second = (model(ids, use_cache=True).cache for _ in range(2))
            with pytest.raises(ValueError, match="Both `past_key_values` and `cache` are set"):
                model(step, cache=first, past_key_values=second)
            with pytest.raises(ValueError, match="Both `past_key_values` and `cache` are set"):
                model.model(step, cache=first, past_key_values=second)


def test_mssa_static_cache_stores_its_key_value_tensor_once():
    sizes = {}
    for attention_type in ("mssa", "mhsa"):
        model = _lm(attention_type=attention_type)
        cache = StaticCache(config=model.config, max_cache_len=16)
        with torch.no_grad():
            model(torch.randint(0, 97, (1, 6)), use_cache=True, cache=cache)
        sizes[attention_type] = sum(layer.keys.numel() + layer.values.numel() for layer in cache.layers)
    assert sizes["mssa"] * 2 == sizes["mhsa"]


@pytest.mark.parametrize("variant", ["mssa", "mhsa"])
def test_continuous_batching_log_probabilities_and_tokens_equal_the_uncached_forward(variant):
    # `generate_batch` returns tokens and their log-probabilities, not logits: the log-probabilities are compared by
    # value with the uncached forward's, and the tokens with its argmax where the top-1 logit beats the second by
    # more than MARGIN (asserted, so that token equality means something). `benchmarks/cache_paths.py` runs it.
    spec = ModelSpec(variant, lambda: _lm(**VARIANTS[variant]), knn=False, family="aot")
    result = PATHS["continuous-batching"].run(spec)
    assert result.notes["min_margin"] > MARGIN, result.notes
    assert not result.notes["token_mismatches"], result.notes
    assert result.max_diff <= TOLERANCE, result.summary()


def test_compiled_static_cache_decoding_has_no_graph_breaks_and_gives_the_uncached_logits():
    assert AoTForCausalLM._can_compile_fullgraph
    torch._dynamo.reset()
    model = _lm()
    ids = torch.randint(2, 97, (2, 11))
    cache = StaticCache(config=model.config, max_cache_len=12)
    decode = torch.compile(model.forward, fullgraph=True)  # a graph break raises
    with torch.no_grad():
        logits = [model(ids[:, :6], use_cache=True, cache=cache).logits]  # eager prefill
        logits += [decode(ids[:, i : i + 1], use_cache=True, cache=cache).logits for i in range(6, 11)]
        expected = model(ids, use_cache=False).logits  # not an eager static cache: both could be wrong alike
    torch.testing.assert_close(torch.cat(logits, dim=1), expected, atol=1e-5, rtol=0)


# --- Auto classes, heads, pipelines -------------------------------------------------------------------------------


def test_auto_model_builds_the_backbone_of_the_checkpoint_in_process(tmp_path):
    AoTForImageClassification(tiny_config()).save_pretrained(tmp_path / "vision")
    _lm().save_pretrained(tmp_path / "text")
    assert type(AutoModel.from_pretrained(tmp_path / "vision")) is AoTVisionModel
    assert type(AutoModel.from_pretrained(tmp_path / "text")) is AoTModel
    assert type(AutoModelForSequenceClassification.from_pretrained(tmp_path / "text")) is AoTForSequenceClassification
    assert type(AutoModelForTokenClassification.from_pretrained(tmp_path / "text")) is AoTForTokenClassification


def _save_text_folder(folder: Path, shared_data: Path, head) -> None:
    from transformers import GPT2TokenizerFast

    tokenizer_dir = shared_data / "tokenizer-gpt2"
    tokenizer = GPT2TokenizerFast.from_pretrained(tokenizer_dir)
    tokenizer.pad_token = tokenizer.eos_token
    config = tiny_config(vocab_size=len(tokenizer), pad_token_id=tokenizer.eos_token_id, num_labels=3)
    head(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)


# A fresh interpreter where `import aot_transformers` fails: the saved folders load through remote code only.
PIPELINES = textwrap.dedent(
    """
    import sys
    sys.modules["aot_transformers"] = None
    import numpy as np
    from PIL import Image
    from transformers import AutoModel, pipeline

    text, vision = sys.argv[1:3]
    assert type(AutoModel.from_pretrained(vision, trust_remote_code=True)).__name__ == "AoTVisionModel"
    assert type(AutoModel.from_pretrained(text, trust_remote_code=True)).__name__ == "AoTModel"
    image = Image.fromarray(np.random.default_rng(0).integers(0, 255, (20, 24, 3), dtype=np.uint8))
    features = pipeline("image-feature-extraction", model=vision, trust_remote_code=True)(image)
    assert np.asarray(features).shape == (1, 17, 32), np.asarray(features).shape
    features = pipeline("feature-extraction", model=text, trust_remote_code=True)("Attention is all")
    assert np.asarray(features).shape[-1] == 32
    labels = pipeline("text-classification", model=text, trust_remote_code=True)(["a sentence", "another one here"])
    assert len(labels) == 2 and labels[0]["label"].startswith("LABEL_"), labels
    tokens = pipeline("token-classification", model=text, trust_remote_code=True)("two words")
    assert len(tokens) >= 2 and "entity" in tokens[0], tokens
    classes = pipeline("image-classification", model=vision, trust_remote_code=True)(image)
    assert len(classes) == 5, classes
    print("ok")
    """
)


def test_pipelines_run_on_saved_folders_through_remote_code(tmp_path, shared_data):
    from transformers import ViTImageProcessor

    text, vision = tmp_path / "text", tmp_path / "vision"
    _save_text_folder(text, shared_data, AoTForSequenceClassification)
    # The token-classification head loads from the same folder (same backbone, a new head), as for GPT-2.
    AoTForImageClassification(tiny_config()).save_pretrained(vision)
    ViTImageProcessor(size={"height": 16, "width": 16}).save_pretrained(vision)
    script = tmp_path / "pipelines.py"
    script.write_text(PIPELINES)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update({"HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(tmp_path / "modules")})
    result = subprocess.run(
        [sys.executable, str(script), str(text), str(vision)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("ok")


@pytest.mark.parametrize("head", [AoTForSequenceClassification, AoTForTokenClassification])
def test_classification_heads_fine_tune_with_trainer(tmp_path, head):
    from datasets import Dataset

    torch.manual_seed(0)
    ids = torch.randint(2, 97, (32, 10))
    if head is AoTForSequenceClassification:
        labels = (ids[:, 0] > 48).long()  # decided by the first token: the last token must look back
        ids[:8, -3:] = 0  # right padding on some rows: the head reads the last real token
    else:
        labels = (ids > 48).long()
    data = Dataset.from_dict({"input_ids": ids.tolist(), "labels": labels.tolist()})
    model = head(tiny_config(pad_token_id=0, num_labels=2, num_hidden_layers=2))
    args = TrainingArguments(
        output_dir=str(tmp_path),
        per_device_train_batch_size=8,
        num_train_epochs=15,
        learning_rate=3e-3,
        report_to=[],
        save_strategy="no",
        logging_steps=1,
        use_cpu=True,
    )
    trainer = Trainer(model=model, args=args, train_dataset=data)
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert losses[-1] < 0.6 * losses[0]


def test_sequence_classification_reads_the_last_real_token():
    model = AoTForSequenceClassification(tiny_config(pad_token_id=0, num_labels=3)).eval()
    ids = torch.randint(2, 97, (1, 6))
    padded = torch.cat([ids, torch.zeros(1, 3, dtype=torch.long)], dim=1)  # right padding
    with torch.no_grad():
        alone = model(ids).logits
        with_padding = model(padded, attention_mask=(padded != 0).long()).logits
    torch.testing.assert_close(with_padding, alone, atol=1e-5, rtol=1e-4)
    no_pad = AoTForSequenceClassification(tiny_config(num_labels=3))
    with pytest.raises(ValueError, match="no padding token is defined"):
        no_pad(torch.randint(2, 97, (2, 6)))


def test_interpolate_pos_encoding_runs_other_resolutions_and_keeps_the_native_one():
    model = AoTForImageClassification(tiny_config()).eval()
    pixels = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        native = model(pixels).logits
        interpolated = model(pixels, interpolate_pos_encoding=True).logits
        larger = model(torch.randn(2, 3, 24, 32), interpolate_pos_encoding=True)
    torch.testing.assert_close(interpolated, native, atol=1e-5, rtol=1e-4)  # same grid: the table is unchanged
    assert larger.logits.shape == (2, 5)
    with pytest.raises(ValueError, match="interpolate_pos_encoding"):
        model(torch.randn(2, 3, 24, 24))
    with pytest.raises(ValueError, match="multiples of `patch_size`"):
        model(torch.randn(2, 3, 18, 16), interpolate_pos_encoding=True)
    model.train()
    loss = model(torch.randn(2, 3, 24, 24), labels=torch.tensor([0, 1]), interpolate_pos_encoding=True).loss
    loss.backward()  # fine-tuning at another resolution trains the original position table
    assert model.model.embeddings.position_embeddings.grad.abs().sum() > 0


# --- version and loading hygiene -----------------------------------------------------------------------------------


def test_remote_code_refuses_an_old_transformers_with_the_required_version(tmp_path):
    code = textwrap.dedent(
        f"""
        import sys, transformers
        transformers.__version__ = "4.57.0"
        sys.path.insert(0, {str(REPO_ROOT / "src" / "aot_transformers")!r})
        try:
            import configuration_aot
        except ImportError as error:
            print(error)
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "transformers>=5.24,<6" in result.stdout and "4.57.0" in result.stdout, result.stdout + result.stderr


def test_the_transformers_floor_is_the_tested_version_in_pyproject_and_the_saved_configs():
    from aot_transformers.configuration_aot import REQUIRED_TRANSFORMERS

    assert f'"transformers{REQUIRED_TRANSFORMERS}"' in (REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8")
    tested = re.search(r"^transformers==(\d+\.\d+)\.", (REPO_ROOT / "constraints.txt").read_text(), re.M)[1]
    assert REQUIRED_TRANSFORMERS.startswith(f">={tested},"), (REQUIRED_TRANSFORMERS, tested)
