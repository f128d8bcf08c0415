"""Loading files from strangers: pickles only through weights_only, clear errors for corrupted weights, configs and
code."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from huggingface_hub.errors import StrictDataclassError

from aot_transformers import AoTConfig, AoTForCausalLM
from aot_transformers._io import load_pretrained
from aot_transformers.cli import main as cli_main
from aot_transformers.errors import UsageError
from aot_transformers.verify import verify_folder
from support import tiny_config


@pytest.fixture
def saved(tmp_path):
    folder = tmp_path / "model"
    AoTForCausalLM(tiny_config()).save_pretrained(folder)
    return folder


def test_pickle_weights_load_as_transformers_loads_them_and_a_pickle_that_runs_code_is_refused(saved, tmp_path):
    # Loading is transformers' own: safetensors first, a pickle only through `torch.load(weights_only=True)`.
    model = AoTForCausalLM.from_pretrained(saved)
    (saved / "model.safetensors").unlink()
    torch.save(model.state_dict(), saved / "pytorch_model.bin")
    assert torch.equal(AoTForCausalLM.from_pretrained(saved).lm_head.weight, model.lm_head.weight)
    marker = tmp_path / "ran"

    class RunsCode:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    torch.save({"model.embed_tokens.weight": RunsCode()}, saved / "pytorch_model.bin")
    with pytest.raises(Exception, match="(?i)weights_only|unpickl"):
        AoTForCausalLM.from_pretrained(saved)
    assert not marker.exists()


def test_saving_writes_safetensors_only_even_when_asked_for_pickle(tmp_path):
    AoTForCausalLM(tiny_config()).save_pretrained(tmp_path, safe_serialization=False)  # transformers 4's flag
    weights = sorted(path.name for path in tmp_path.iterdir() if path.suffix not in (".json", ".py"))
    assert weights == ["model.safetensors"]


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty"])
def test_corrupted_weights_give_clear_error(saved, damage):
    path = saved / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes({"truncate": data[: len(data) // 2], "garbage": b"\x00garbage" * 50, "empty": b""}[damage])
    with pytest.raises(OSError, match="corrupted or truncated"):  # as every `aot` command loads a folder
        load_pretrained(AoTForCausalLM, saved)


@pytest.mark.parametrize(
    ("edit", "cause"),
    [
        (("attention_type", "quantum"), TypeError),  # not one of the field's choices
        (("hidden_size", "32"), TypeError),
        (("knn_k", -1), ValueError),
        (("num_attention_heads", 5), ValueError),  # does not divide hidden_size
    ],
)
def test_bad_config_json_gives_clear_error(saved, edit, cause):
    config = json.loads((saved / "config.json").read_text())
    config[edit[0]] = edit[1]
    (saved / "config.json").write_text(json.dumps(config))
    with pytest.raises(StrictDataclassError, match=edit[0]) as error:  # as transformers' own configs
        AoTForCausalLM.from_pretrained(saved)
    assert isinstance(error.value.__cause__, cause)


def test_config_records_code_hashes(saved):
    recorded = json.loads((saved / "config.json").read_text())["code_sha256"]
    assert set(recorded) == {"configuration_aot.py", "attention_aot.py", "modeling_aot.py"}
    assert all(len(h) == 64 for h in recorded.values())


def test_verify_clean_edited_missing_and_pickle(saved, capsys):
    report = verify_folder(saved)
    assert report.ok and report.matches_installed
    assert cli_main(["verify", str(saved)]) == 0
    with open(saved / "modeling_aot.py", "a") as handle:
        handle.write("\nimport os  # injected\n")
    report = verify_folder(saved)
    assert report.edited == ["modeling_aot.py"] and not report.ok
    (saved / "attention_aot.py").unlink()
    torch.save({}, saved / "extra.pt")
    report = verify_folder(saved)
    assert report.missing == ["attention_aot.py"] and report.pickle_files == ["extra.pt"]
    assert cli_main(["verify", str(saved)]) == 1
    out = capsys.readouterr().out
    assert "EDITED   modeling_aot.py" in out and "MISSING  attention_aot.py" in out and "FAILED" in out


def test_verify_rejects_non_model_folder(tmp_path):
    # Bad input, not a failed check: UsageError, which `aot verify` reports with exit code 2.
    with pytest.raises(UsageError, match="config.json"):
        verify_folder(tmp_path)


REMOTE_LOAD = textwrap.dedent(
    """
    import sys
    sys.modules["aot_transformers"] = None
    from transformers import AutoModelForCausalLM
    try:
        AutoModelForCausalLM.from_pretrained(sys.argv[1], trust_remote_code=True)
    except Exception as error:
        print(f"{type(error).__name__}: {error}")
        sys.exit(3)
    print("loaded")
    """
)


def _remote_load(tmp_path, folder) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update({"HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(tmp_path / "modules")})
    return subprocess.run(
        [sys.executable, "-c", REMOTE_LOAD, str(folder)], env=env, capture_output=True, text=True, cwd=tmp_path
    )


def test_remote_load_missing_code_file_names_it(tmp_path, saved):
    (saved / "attention_aot.py").unlink()
    result = _remote_load(tmp_path, saved)
    assert result.returncode != 0
    assert "attention_aot.py" in result.stdout + result.stderr


def test_config_with_wrong_types_via_autoconfig(saved):
    from transformers import AutoConfig

    config = json.loads((saved / "config.json").read_text())
    config["layer_norm"] = "yes"
    (saved / "config.json").write_text(json.dumps(config))
    with pytest.raises(StrictDataclassError, match="'layer_norm' expected bool, got str"):
        AutoConfig.from_pretrained(saved)
    assert AoTConfig  # the package's class is what AutoConfig resolved to
