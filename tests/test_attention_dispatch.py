"""How a model picks its attention kernel: from transformers' registry, where the package registers its chunked "knn"
kernel, else from its own file (two folders saved by different releases never run each other's kernels), k-NN
attention is an allow-list (with `knn_k` set no dense backend is accepted, and the k-NN backend needs a k), and
MSSA's tied output projection goes through the projection module (a merged LoRA adapter computes what the adapter
did)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import pytest
import torch
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from aot_transformers import AoTForCausalLM, knn
from support import tiny_config


def _rehash(folder, name: str) -> None:
    """Record an edited code file's hash in config.json, as a release with that code would have saved it."""
    config_path = folder / "config.json"
    config = json.loads(config_path.read_text())
    config["code_sha256"][name] = hashlib.sha256((folder / name).read_bytes()).hexdigest()
    config_path.write_text(json.dumps(config))


def test_two_folders_loaded_in_one_process_each_run_their_own_kernel(tmp_path):
    model = AoTForCausalLM(tiny_config(knn_k=3)).eval()
    ids = torch.randint(0, 97, (2, 9))
    with torch.no_grad():
        torch.save({"ids": ids, "logits": model(ids).logits}, tmp_path / "expected.pt")
    first, second = tmp_path / "release-a", tmp_path / "release-b"
    model.save_pretrained(first)
    model.save_pretrained(second)
    # Release B's k-NN kernel (its eager attention with `knn_k`) is a different one: it doubles every output.
    source = (second / "attention_aot.py").read_text()
    last = "    return output.transpose(1, 2).contiguous(), weights\n"
    assert source.count(last) == 1
    (second / "attention_aot.py").write_text(source.replace(last, last.replace("output.", "2 * output.")))
    _rehash(second, "attention_aot.py")
    # A process without aot-transformers imported, as a Hub user's: both folders run as remote code, B imported last,
    # each with its own one-piece k-NN attention (no "knn" kernel is registered in transformers there).
    script = f"""
import torch
from transformers import AutoModelForCausalLM
expected = torch.load({str(tmp_path / "expected.pt")!r})
a = AutoModelForCausalLM.from_pretrained({str(first)!r}, trust_remote_code=True).eval()
b = AutoModelForCausalLM.from_pretrained({str(second)!r}, trust_remote_code=True).eval()
assert type(a).__module__.startswith("transformers_modules") and type(a).__module__ != type(b).__module__
with torch.no_grad():
    print((a(expected["ids"]).logits - expected["logits"]).abs().max().item())
    print((b(expected["ids"]).logits - expected["logits"]).abs().max().item())
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    difference_a, difference_b = map(float, result.stdout.split()[-2:])
    assert difference_a < 1e-6  # A still runs A's kernel (which equals the package's chunked one to float rounding)
    assert difference_b > 1e-2  # and B its own


@pytest.mark.parametrize("backend", ["sdpa", "eager", "flex_attention", "shared_projection", "paged|eager"])
def test_knn_k_refuses_every_backend_that_is_not_k_nn(backend):
    with pytest.raises(ValueError, match=r"knn_k=3.*attn_implementation='knn'"):
        AoTForCausalLM._from_config(tiny_config(knn_k=3), attn_implementation=backend)
    model = AoTForCausalLM(tiny_config(knn_k=3))
    with pytest.raises(ValueError, match="knn_k=3"):
        model.set_attn_implementation(backend)
    assert model.config._attn_implementation == "knn"


def test_knn_runs_the_kernel_transformers_registry_holds_under_that_name():
    """Importing the package registers its chunked kernel as "knn"; an AoT model runs what the registry holds (a
    folder loaded without the package, where it holds none, runs its own one-piece kernel: the test above)."""
    assert ALL_ATTENTION_FUNCTIONS["knn"] is knn.knn_attention_forward
    model, calls = AoTForCausalLM(tiny_config(knn_k=3)).eval(), []

    def spy(*args, **kwargs):
        calls.append(1)
        return knn.knn_attention_forward(*args, **kwargs)

    ALL_ATTENTION_FUNCTIONS["knn"] = spy  # this registry's own entry, deleted below
    try:
        with torch.no_grad():
            model(torch.randint(0, 97, (2, 9)))
    finally:
        del ALL_ATTENTION_FUNCTIONS["knn"]
    assert len(calls) == model.config.num_hidden_layers


def test_a_dense_backend_that_skipped_transformers_checks_is_refused_at_the_forward():
    """transformers sets a Hub kernel ("org/name") without `get_correct_attn_implementation`; with `knn_k` the
    dispatch refuses any dense backend it meets instead of attending to every key."""
    model = AoTForCausalLM(tiny_config(knn_k=3))
    model.config._attn_implementation = "sdpa"  # as a Hub kernel would be set
    with pytest.raises(ValueError, match=r"knn_k=3.*attn_implementation='knn'"):
        model(torch.randint(0, 97, (1, 5)))


def test_the_knn_backend_without_knn_k_is_refused():
    with pytest.raises(ValueError, match="needs `knn_k`"):
        AoTForCausalLM._from_config(tiny_config(), attn_implementation="knn")
    model = AoTForCausalLM(tiny_config())
    with pytest.raises(ValueError, match="needs `knn_k`"):
        model.set_attn_implementation("knn")


def test_tied_output_projection_sees_the_lora_adapter_so_merging_keeps_the_function():
    peft = pytest.importorskip("peft")
    model = AoTForCausalLM(tiny_config(tie_output_projection=True)).eval()
    config = peft.LoraConfig(r=4, target_modules=["subspace_proj"], init_lora_weights=False)
    adapted = peft.get_peft_model(model, config).eval()
    ids = torch.randint(0, 97, (2, 9))
    with torch.no_grad():
        with adapted.disable_adapter():
            plain = adapted(ids).logits
        with_adapter = adapted(ids).logits
        merged = adapted.merge_and_unload()(ids).logits
    assert (with_adapter - plain).abs().max() > 1e-3  # the adapter changes the model
    torch.testing.assert_close(merged, with_adapter, rtol=0, atol=1e-5)


def test_transposing_through_the_module_equals_the_transposed_weight_in_values_and_gradients():
    from aot_transformers.modeling_aot import _transposed

    linear = torch.nn.Linear(6, 6, bias=True).double()
    outputs = torch.randn(2, 5, 6, dtype=torch.float64, requires_grad=True)
    got = _transposed(linear, outputs)
    expected = torch.nn.functional.linear(outputs, linear.weight.t())  # the bias is not part of W^O
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)
    upstream = torch.randn_like(got)
    grads = torch.autograd.grad(got, (outputs, linear.weight), upstream)
    expected_grads = torch.autograd.grad(expected, (outputs, linear.weight), upstream)
    for grad, want in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(grad, want, rtol=0, atol=1e-12)
    with torch.no_grad():  # generation
        torch.testing.assert_close(_transposed(linear, outputs), expected.detach(), rtol=0, atol=1e-12)
