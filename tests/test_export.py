"""Saved folders load through the Auto classes with trust_remote_code=True, without aot-transformers installed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from functools import partial
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from aot_transformers import AoTForCausalLM, AoTForImageClassification, attention_aot, export_model
from support import tiny_config

CODE_FILES = {"configuration_aot.py", "attention_aot.py", "modeling_aot.py"}
TEXT_AUTO_MAP = {
    "AutoConfig": "configuration_aot.AoTConfig",
    "AutoModel": "modeling_aot.AoTModel",
    "AutoModelForCausalLM": "modeling_aot.AoTForCausalLM",
    "AutoModelForSequenceClassification": "modeling_aot.AoTForSequenceClassification",
    "AutoModelForTokenClassification": "modeling_aot.AoTForTokenClassification",
}
VISION_AUTO_MAP = {
    "AutoConfig": "configuration_aot.AoTConfig",
    "AutoModel": "modeling_aot.AoTVisionModel",
    "AutoModelForImageClassification": "modeling_aot.AoTForImageClassification",
}

# Runs in a fresh interpreter where `import aot_transformers` fails: only transformers' remote-code path can work.
LOADER = textwrap.dedent(
    """
    import sys
    sys.modules["aot_transformers"] = None  # make the package unimportable
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import AutoModel, AutoModelForCausalLM, AutoModelForImageClassification

    source, inputs_file, output_file, kind, threads = sys.argv[1:6]
    torch.set_num_threads(int(threads))  # the parent's thread count, so that reductions run in the same order
    inputs = load_file(inputs_file)
    results = {}
    with torch.no_grad():
        if kind == "text":
            lm = AutoModelForCausalLM.from_pretrained(source, trust_remote_code=True).eval()
            assert type(lm).__module__.startswith("transformers_modules"), type(lm).__module__
            results["logits"] = lm(inputs["input_ids"]).logits
            base = AutoModel.from_pretrained(source, trust_remote_code=True).eval()
            results["hidden"] = base(inputs["input_ids"]).last_hidden_state
        else:
            clf = AutoModelForImageClassification.from_pretrained(source, trust_remote_code=True).eval()
            results["logits"] = clf(inputs["pixel_values"]).logits
    save_file({k: v.contiguous() for k, v in results.items()}, output_file)
    """
)


def _run_fresh(tmp_path: Path, source: str, inputs: dict, kind: str, env_extra: dict | None = None) -> dict:
    script = tmp_path / "load.py"
    script.write_text(LOADER)
    save_file(inputs, str(tmp_path / "inputs.safetensors"))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_MODULES_CACHE": str(tmp_path / "modules")})
    env.update(env_extra or {})
    subprocess.run(
        [
            sys.executable,
            str(script),
            source,
            str(tmp_path / "inputs.safetensors"),
            str(tmp_path / "out.st"),
            kind,
            str(torch.get_num_threads()),
        ],
        check=True,
        env=env,
        cwd=tmp_path,
    )
    return load_file(str(tmp_path / "out.st"))


@pytest.mark.parametrize("model_class", [AoTForCausalLM, AoTForImageClassification])
def test_saved_folder_layout(tmp_path, model_class):
    model = model_class(tiny_config())
    model.save_pretrained(tmp_path)
    files = {p.name for p in tmp_path.iterdir()}
    assert CODE_FILES | {"config.json", "model.safetensors"} <= files
    assert not any(name.endswith((".bin", ".pt", ".pkl")) for name in files)
    config = json.loads((tmp_path / "config.json").read_text())
    # Each folder maps the Auto classes its weights can build, AutoModel to its own backbone.
    assert config["auto_map"] == (VISION_AUTO_MAP if model_class is AoTForImageClassification else TEXT_AUTO_MAP)
    assert config["model_type"] == "aot"
    assert config["required_transformers"] == ">=5.24,<6"


def test_round_trip_keeps_weights_and_config(tmp_path):
    model = AoTForCausalLM(tiny_config(knn_k=3, attention_type="mhsa")).eval()
    model.save_pretrained(tmp_path)
    loaded = AoTForCausalLM.from_pretrained(tmp_path).eval()
    assert loaded.config.knn_k == 3 and loaded.config.attention_type == "mhsa"
    for (name, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items(), strict=True):
        assert torch.equal(a, b), f"{name} was re-initialised on load"
    ids = torch.randint(0, 97, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, loaded(ids).logits, rtol=0, atol=0)


@pytest.mark.parametrize("attention_type", ["mssa", "mhsa"])
def test_fresh_process_without_package_loads_text_model(tmp_path, attention_type):
    model = AoTForCausalLM(tiny_config(attention_type=attention_type, normalize_query=True)).eval()
    folder = tmp_path / "model"
    export_model(model, folder)
    ids = torch.randint(0, 97, (2, 9))
    out = _run_fresh(tmp_path, str(folder), {"input_ids": ids}, "text")
    with torch.no_grad():
        torch.testing.assert_close(out["logits"], model(ids).logits, rtol=0, atol=0)
        torch.testing.assert_close(out["hidden"], model.model(ids).last_hidden_state, rtol=0, atol=0)


def test_fresh_process_without_package_loads_image_classifier(tmp_path):
    model = AoTForImageClassification(tiny_config(knn_k=0.5)).eval()
    folder = tmp_path / "model"
    export_model(model, folder)
    pixels = torch.randn(2, 3, 16, 16)
    out = _run_fresh(tmp_path, str(folder), {"pixel_values": pixels}, "image")
    # Without the package the folder runs its own one-piece k-NN attention (`attention_aot`): bit for bit what that
    # kernel gives here. The package's chunked kernel, registered as "knn", sums in another order: float rounding.
    unit_kernel = partial(attention_aot.eager_attention_forward, knn_k=0.5)  # what `_attention_function` falls back to
    ALL_ATTENTION_FUNCTIONS["knn"] = unit_kernel  # this registry's own entry, deleted below
    try:
        with torch.no_grad():
            unit_logits = model(pixels).logits
    finally:
        del ALL_ATTENTION_FUNCTIONS["knn"]
    torch.testing.assert_close(out["logits"], unit_logits, rtol=0, atol=0)
    with torch.no_grad():
        torch.testing.assert_close(out["logits"], model(pixels).logits, rtol=0, atol=1e-6)


def test_the_tokenizer_of_a_saved_folder_loads_without_running_or_asking_about_its_code(tmp_path):
    # The README's two calls, in a process without the package and with no terminal to answer a question on: both
    # load the tokenizer the folder holds, and nothing is imported from the folder.
    import subprocess
    import sys

    from support import char_tokenizer

    folder = tmp_path / "model"
    export_model(AoTForCausalLM(tiny_config(vocab_size=98)), folder, tokenizer=char_tokenizer())
    script = f"""
import sys
sys.modules["aot_transformers"] = None
from transformers import AutoTokenizer, PreTrainedTokenizerFast
for tokenizer in (AutoTokenizer.from_pretrained({str(folder)!r}, trust_remote_code=False),
                  PreTrainedTokenizerFast.from_pretrained({str(folder)!r})):
    print(tokenizer("ab ba").input_ids)
print(sorted(name for name in sys.modules if name.startswith("transformers_modules")))
"""
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=300
    )
    assert result.returncode == 0, result.stderr[-2000:]
    first, second, imported = result.stdout.strip().splitlines()
    assert first == second == str(char_tokenizer()("ab ba").input_ids) and imported == "[]"
    assert "Do you wish to run the custom code" not in result.stdout + result.stderr


def test_hub_style_repo_id_from_local_cache(tmp_path):
    """`from_pretrained("org/name", trust_remote_code=True)` offline, resolved from an HF cache snapshot."""
    model = AoTForCausalLM(tiny_config()).eval()
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--aot-test--tiny-aot"
    snapshot = repo / "snapshots" / commit
    model.save_pretrained(snapshot)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    ids = torch.randint(0, 97, (1, 7))
    cache = {"HF_HUB_CACHE": str(tmp_path / "hub")}
    out = _run_fresh(tmp_path, "aot-test/tiny-aot", {"input_ids": ids}, "text", cache)
    with torch.no_grad():
        torch.testing.assert_close(out["logits"], model(ids).logits, rtol=0, atol=0)


def test_export_is_atomic_and_keeps_old_folder_on_failure(tmp_path):
    folder = tmp_path / "model"
    export_model(AoTForCausalLM(tiny_config()), folder)
    before = (folder / "model.safetensors").read_bytes()

    class Broken:
        def save_pretrained(self, path):
            raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        export_model(AoTForCausalLM(tiny_config(hidden_size=64)), folder, tokenizer=Broken())
    assert (folder / "model.safetensors").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"], "staging folder left behind"
    with pytest.raises(FileExistsError):
        export_model(AoTForCausalLM(tiny_config()), folder, overwrite=False)


def test_export_takes_any_transformers_model_and_rejects_other_modules(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    with pytest.raises(TypeError, match="must be a transformers model, got Linear"):
        export_model(torch.nn.Linear(2, 2), tmp_path / "x")
    baseline = GPT2LMHeadModel(GPT2Config(n_embd=16, n_layer=1, n_head=2, n_positions=8, vocab_size=11)).eval()
    export_model(baseline, tmp_path / "gpt2")  # a baseline trained by `aot train --model_type gpt2`: no code files
    assert not list((tmp_path / "gpt2").glob("*.py"))
    reloaded = GPT2LMHeadModel.from_pretrained(tmp_path / "gpt2").eval()
    ids = torch.tensor([[1, 2, 3]])
    torch.testing.assert_close(reloaded(ids).logits, baseline(ids).logits)


def test_copied_code_files_are_the_package_files(tmp_path):
    AoTForCausalLM(tiny_config()).save_pretrained(tmp_path)
    package = Path(__file__).resolve().parents[1] / "src" / "aot_transformers"
    for name in CODE_FILES:
        assert (tmp_path / name).read_text() == (package / name).read_text()
    assert shutil.which(sys.executable)
