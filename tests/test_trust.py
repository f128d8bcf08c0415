"""Trust boundaries ("nothing lost, nothing run unchecked"): `aot verify`, `aot eval lm`'s remote code, `aot push`,
and the model card.

Every case runs in-process on tiny folders in `tmp_path`; pushes go to a fake `HfApi` (no network).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from aot_transformers._io import atomic_write_text
from aot_transformers.cli import main as aot
from aot_transformers.errors import UsageError
from aot_transformers.evaluation import evaluate_model, markdown_table, read_results, update_model_card
from aot_transformers.evaluation.results import NonFiniteMetricError
from aot_transformers.evaluation.runner import EvaluationReport, load_model_and_tokenizer, remote_code_allowed
from aot_transformers.hub import push_to_hub
from aot_transformers.verify import verify_folder
from support import FIXTURES, char_tokenizer, save_model, tiny_aot

WIKI = ["--tasks", "wikitext", "--data", f"wikitext={FIXTURES / 'wiki.test.raw'}", "--limit", "1", "--no-progress"]


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    """A tiny AoT language model with its tokenizer, saved as users save it."""
    return save_model(tiny_aot(max_length=32), char_tokenizer(), tmp_path_factory.mktemp("pristine") / "model")


@pytest.fixture
def folder(pristine, tmp_path) -> Path:
    """A fresh copy of the pristine folder for a test to tamper with."""
    return Path(shutil.copytree(pristine, tmp_path / "model"))


def edit_json(path: Path, **changes) -> None:
    payload = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            payload.pop(key, None)
        else:
            payload[key] = value
    path.write_text(json.dumps(payload))


def map_model(folder: Path, reference: str) -> None:
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"]["AutoModelForCausalLM"] = reference
    (folder / "config.json").write_text(json.dumps(config))


def evil_module(folder: Path, marker: Path, name: str = "evil.py") -> None:
    """A module that leaves `marker` behind when it is imported (so a test can see whether it ran)."""
    (folder / name).write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).write_text('ran')\n"
        "from .modeling_aot import AoTForCausalLM as EvilForCausalLM\n"
    )


def verify_exit(folder: Path, capsys) -> tuple[int, str, str]:
    code = aot(["verify", str(folder)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def one_line_error(err: str) -> str:
    """The stderr of a command, which must be exactly one line without a traceback (progress bars aside)."""
    lines = [line for line in err.splitlines() if line.strip() and "it/s]" not in line and "%|" not in line]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


# --- `aot verify` checks everything loading can run ----------------------------------------------------------


def test_verify_passes_a_pristine_folder(folder, capsys):
    code, out, _ = verify_exit(folder, capsys)
    assert code == 0 and "OK" in out


def test_verify_fails_an_auto_map_to_a_foreign_module_without_importing_it(folder, tmp_path, capsys):
    evil_module(folder, tmp_path / "ran")
    map_model(folder, "evil.EvilForCausalLM")
    code, out, err = verify_exit(folder, capsys)
    assert code == 1 and "evil.py" in out and "FAILED" in out
    assert "names evil.py, not one of" in err and "evil.py is not an aot-transformers code file" in err
    assert not (tmp_path / "ran").exists()  # verify never imports the folder's code


def test_verify_fails_an_auto_map_to_another_repository(folder, capsys):
    map_model(folder, "other/repo--modeling_aot.AoTForCausalLM")
    code, out, err = verify_exit(folder, capsys)
    assert code == 1 and "runs code from another repository" in err


def test_verify_fails_an_auto_map_to_a_missing_module(folder, capsys):
    map_model(folder, "modeling_extra.Model")
    assert verify_exit(folder, capsys)[0] == 1
    (folder / "modeling_aot.py").unlink()
    map_model(folder, "modeling_aot.AoTForCausalLM")
    code, out, _ = verify_exit(folder, capsys)
    assert code == 1 and "MISSING  modeling_aot.py" in out


def test_verify_fails_a_tokenizer_auto_map_to_foreign_code(folder, tmp_path, capsys):
    evil_module(folder, tmp_path / "ran", "tokenization_evil.py")
    edit_json(folder / "tokenizer_config.json", auto_map={"AutoTokenizer": ["tokenization_evil.Tok", None]})
    code, out, err = verify_exit(folder, capsys)
    assert code == 1 and "tokenizer_config.json: AutoTokenizer -> 'tokenization_evil.Tok'" in err
    assert "tokenization_evil.py is not an aot-transformers code file" in err


def test_verify_fails_an_auto_map_in_any_config_json(folder, capsys):
    (folder / "preprocessor_config.json").write_text(json.dumps({"auto_map": {"AutoProcessor": "modeling_aot.X"}}))
    code, _, err = verify_exit(folder, capsys)
    assert code == 1 and "preprocessor_config.json: AutoProcessor" in err


def test_verify_fails_edited_code_whose_recorded_hash_was_rewritten(folder, capsys):
    path = folder / "modeling_aot.py"
    path.write_text(path.read_text() + "\nimport os  # planted\n")
    config = json.loads((folder / "config.json").read_text())
    config["code_sha256"]["modeling_aot.py"] = hashlib.sha256(path.read_bytes()).hexdigest()
    (folder / "config.json").write_text(json.dumps(config))
    report = verify_folder(folder)
    assert not report.edited  # the recorded hash matches the edit ...
    assert report.differs_from_installed == ["modeling_aot.py"] and not report.ok  # ... the installed package does not
    code, out, err = verify_exit(folder, capsys)
    assert code == 1 and "DIFFERS  modeling_aot.py" in out and "differs from the installed" in err


def test_verify_checks_python_files_at_any_depth(folder, capsys):
    (folder / "sub").mkdir()
    (folder / "sub" / "helper.py").write_text("print('hi')\n")
    shutil.copy(folder / "attention_aot.py", folder / "sub" / "attention_aot.py")  # an exact copy is harmless
    report = verify_folder(folder)
    assert report.unknown_code == ["sub/helper.py"] and not report.differs_from_installed
    (folder / "sub" / "helper.py").unlink()
    assert verify_folder(folder).ok
    with open(folder / "sub" / "attention_aot.py", "a") as handle:
        handle.write("# edited\n")
    report = verify_folder(folder)
    assert report.differs_from_installed == ["sub/attention_aot.py"] and not report.ok
    assert verify_exit(folder, capsys)[0] == 1


# --- the load-time hash check can be switched off; verify cannot ---------------------------------------------


def test_folder_without_code_sha256_verifies_only_with_the_installed_code(folder, capsys):
    edit_json(folder / "config.json", code_sha256=None)
    report = verify_folder(folder)
    assert report.unrecorded and report.ok  # byte for byte the installed package: nothing unchecked runs
    assert "NO HASH" in verify_exit(folder, capsys)[1]
    with open(folder / "attention_aot.py", "a") as handle:
        handle.write("\n# edited, hash deleted so that loading does not notice\n")
    code, out, _ = verify_exit(folder, capsys)
    assert code == 1 and "cannot be checked" in out and "DIFFERS  attention_aot.py" in out


def test_card_and_readme_say_what_the_hash_check_protects():
    from aot_transformers.model_card import render_model_card
    from support import REPO_ROOT, tiny_config

    card = " ".join(str(render_model_card(tiny_config(), model_name="m")).split())
    assert "aot verify FOLDER" in card and "Loading checks nothing itself" in card
    assert "could not protect you from a folder made to deceive" in card
    readme = (REPO_ROOT / "README.md").read_text()
    section = readme.split("### Trusting a model folder", 1)[1].split("\n#", 1)[0]
    assert "aot verify" in section and "made to deceive" in section and "--trust-remote-code" in section


# --- `aot eval lm` does not run a folder's code unasked ------------------------------------------------------


def test_eval_lm_of_an_unverified_folder_needs_trust_remote_code(folder, tmp_path, capsys):
    evil_module(folder, tmp_path / "ran")
    map_model(folder, "evil.EvilForCausalLM")
    out = tmp_path / "out"
    code = aot(["eval", "lm", str(folder), *WIKI, "--output-dir", str(out)])
    line = one_line_error(capsys.readouterr().err)
    assert code == 2 and "aot verify" in line and "--trust-remote-code" in line
    assert not (tmp_path / "ran").exists() and not out.exists()
    assert remote_code_allowed(folder, trust_remote_code=True)


def test_eval_lm_trusts_a_verified_folder_and_runs_no_code_of_plain_folders(folder, tmp_path):
    assert remote_code_allowed(folder) is True
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    assert remote_code_allowed(plain) is False
    assert remote_code_allowed("someone/model") is False  # a Hub id: only with the flag
    report = evaluate_model(str(folder), "wikitext", data={"wikitext": FIXTURES / "wiki.test.raw"}, limit=1)
    assert report.results["wikitext"]["loss"] > 0
    # The verified folder's code is the installed package's: that is what runs, nothing imported from the folder.
    model, _ = load_model_and_tokenizer(folder)
    assert type(model).__module__ == "aot_transformers.modeling_aot"


def test_eval_lm_loads_a_hub_id_without_remote_code_unless_asked(monkeypatch, tmp_path, capsys):
    import transformers

    calls = []

    def fake_tokenizer(name, **kwargs):
        calls.append(("tokenizer", kwargs.get("trust_remote_code")))
        return char_tokenizer()

    def fake_model(name, **kwargs):
        calls.append(("model", kwargs.get("trust_remote_code")))
        if not kwargs.get("trust_remote_code"):
            raise ValueError(f"{name} contains custom code which must be executed; set trust_remote_code=True")
        model = tiny_aot(max_length=32)
        return (model, {"missing_keys": []}) if kwargs.get("output_loading_info") else model

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", fake_tokenizer)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", fake_model)
    argv = ["eval", "lm", "someone/custom-model", *WIKI, "--output-dir", str(tmp_path / "out")]
    assert aot(argv) == 2
    line = one_line_error(capsys.readouterr().err)
    assert "runs its own code when loaded" in line and "--trust-remote-code" in line and "aot verify" in line
    assert calls == [("tokenizer", False), ("model", False)] and not (tmp_path / "out").exists()
    calls.clear()
    assert aot([*argv, "--trust-remote-code"]) == 0
    assert calls == [("tokenizer", True), ("model", True)]
    assert read_results(tmp_path / "out" / "results.json").results["wikitext"]["loss"] > 0


# --- `aot push` uploads only what was checked ----------------------------------------------------------------


class FakeHfApi:
    """Records every call; uploads nothing."""

    calls: list = []

    def __init__(self, endpoint=None, token=None):
        self.endpoint = endpoint or "https://hub.invalid"

    def create_repo(self, repo_id, **kwargs):
        FakeHfApi.calls.append(("create_repo", repo_id))
        return f"{self.endpoint}/{repo_id}"

    def create_branch(self, *args, **kwargs):
        FakeHfApi.calls.append(("create_branch", args))

    def upload_folder(self, **kwargs):
        FakeHfApi.calls.append(("upload_folder", kwargs["folder_path"]))
        return type("Info", (), {"commit_url": "https://hub.invalid/commit/1", "oid": "1"})()

    def upload_file(self, **kwargs):
        FakeHfApi.calls.append(("upload_file", kwargs["path_in_repo"]))
        return type("Info", (), {"commit_url": "https://hub.invalid/commit/2", "oid": "2"})()


@pytest.fixture
def fake_hub(monkeypatch):
    import huggingface_hub

    FakeHfApi.calls = []
    monkeypatch.setattr(huggingface_hub, "HfApi", FakeHfApi)
    return FakeHfApi


def test_push_uploads_a_clean_folder(folder, fake_hub, capsys):
    assert aot(["push", str(folder), "--repo-id", "someone/tiny"]) == 0
    assert ("upload_folder", folder) in fake_hub.calls


def test_push_refuses_a_link_out_of_the_folder(folder, tmp_path, fake_hub, capsys):
    secret = tmp_path / "secret.txt"
    secret.write_text("hf_secret_token")
    (folder / "notes.txt").symlink_to(secret)
    assert aot(["push", str(folder), "--repo-id", "someone/tiny"]) == 2
    line = one_line_error(capsys.readouterr().err)
    assert "notes.txt is a link" in line and "Nothing was uploaded" in line
    assert fake_hub.calls == []
    (folder / "notes.txt").unlink()
    (folder / "linked").symlink_to(tmp_path, target_is_directory=True)
    with pytest.raises(UsageError, match="linked is a link"):
        push_to_hub(folder, "someone/tiny")
    assert fake_hub.calls == []


@pytest.mark.parametrize("name", ["pytorch_model.bin", "sub/WEIGHTS.PT", "extra.PICKLE", "deep/er/state.Ckpt"])
def test_push_refuses_pickles_at_any_depth_and_case(folder, fake_hub, name, capsys):
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({}, path)
    assert aot(["push", str(folder), "--repo-id", "someone/tiny"]) == 2
    assert f"{name} is a pickle" in one_line_error(capsys.readouterr().err)
    assert fake_hub.calls == []


def test_push_refuses_code_that_differs_from_the_installed_package(folder, fake_hub, capsys):
    path = folder / "attention_aot.py"
    path.write_text(path.read_text() + "\n# planted\n")
    edit_json(folder / "config.json", code_sha256=None)
    assert aot(["push", str(folder), "--repo-id", "someone/tiny"]) == 2
    assert "attention_aot.py differs from the installed" in one_line_error(capsys.readouterr().err)
    assert fake_hub.calls == []


def test_push_keeps_checkpoints_and_training_args_local(folder, fake_hub):
    (folder / "checkpoint-2").mkdir()
    torch.save({}, folder / "checkpoint-2" / "optimizer.pt")
    torch.save({}, folder / "training_args.bin")
    result = push_to_hub(folder, "someone/tiny")
    assert "training_args.bin" not in result.files and not any(n.startswith("checkpoint-") for n in result.files)


# --- one card update at a time, written atomically -----------------------------------------------------------


def test_card_update_on_a_locked_folder_fails_at_once(folder, tmp_path, capsys):
    from filelock import FileLock

    lock_path = folder.parent / f".{folder.name}.aot.lock"  # beside the folder: a plain upload never publishes it
    held = FileLock(str(lock_path), timeout=0)
    held.acquire()
    try:
        code = aot(["eval", "lm", str(folder), *WIKI, "--output-dir", str(tmp_path / "o"), "--update-card"])
        line = one_line_error(capsys.readouterr().err)
        assert code == 2 and f"another aot run holds {lock_path}" in line
        assert not (folder / "README.md").exists() and not (tmp_path / "o").exists()
    finally:
        held.release()
    assert aot(["eval", "lm", str(folder), *WIKI, "--output-dir", str(tmp_path / "o"), "--update-card"]) == 0
    assert "wikitext" in (folder / "README.md").read_text().lower()
    assert not any(p.name.endswith(".lock") for p in folder.rglob("*")), "no lock file is left inside the model folder"


HOLD_LOCK = """
import sys
from filelock import FileLock
lock = FileLock(sys.argv[1], timeout=0)
lock.acquire()
print("held", flush=True)
sys.stdin.read()  # until the test closes our stdin
"""


def test_card_update_fails_while_another_process_holds_the_folder(folder, tmp_path, capsys):
    import subprocess
    import sys

    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(folder.parent / f".{folder.name}.aot.lock")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        code = aot(["eval", "lm", str(folder), *WIKI, "--output-dir", str(tmp_path / "o"), "--update-card"])
        assert code == 2 and "another aot run holds" in one_line_error(capsys.readouterr().err)
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    assert not (folder / "README.md").exists()


def test_card_write_is_atomic(tmp_path, monkeypatch):
    card = tmp_path / "README.md"
    card.write_text("old card\n")

    def crash(*args):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="disk full"):
        atomic_write_text(card, "new card\n")
    assert card.read_text() == "old card\n" and [p.name for p in tmp_path.iterdir()] == ["README.md"]


# --- a NaN model never reaches a card or a table -------------------------------------------------------------


def test_eval_lm_of_a_nan_model_fails_and_writes_nothing(tmp_path, capsys):
    model = tiny_aot(max_length=32)
    with torch.no_grad():
        model.lm_head.weight.fill_(float("nan"))
    nan_folder = save_model(model, char_tokenizer(), tmp_path / "nan-model")
    (nan_folder / "README.md").write_text("---\nlicense: mit\n---\n# my card\n")
    before = (nan_folder / "README.md").read_bytes()
    out = tmp_path / "out"
    code = aot(["eval", "lm", str(nan_folder), *WIKI, "--output-dir", str(out), "--update-card"])
    line = one_line_error(capsys.readouterr().err)
    assert code == 1 and "non-finite metrics" in line and "wikitext.loss=nan" in line
    assert not out.exists() and (nan_folder / "README.md").read_bytes() == before


def test_non_finite_metrics_never_reach_a_card_or_a_table(tmp_path):
    report = EvaluationReport(model="m", results={"ptb": {"loss": float("inf"), "source": {"type": "file"}}})
    with pytest.raises(NonFiniteMetricError, match="ptb.loss=inf"):
        update_model_card(tmp_path / "README.md", report)
    assert not (tmp_path / "README.md").exists()
    assert "not finite" in markdown_table([report]) and "inf" not in markdown_table([report]).split("\n")[2]


# --- bad input is exit 2 and one line; a failed check is exit 1 ----------------------------------------------


@pytest.mark.parametrize("case", ["missing", "file", "no-config", "not-json", "json-list", "binary"])
def test_verify_of_a_missing_or_malformed_folder_is_one_line_exit_2(tmp_path, case, capsys):
    target = tmp_path / "x"
    if case == "file":
        target.write_text("x")
    elif case != "missing":
        target.mkdir()
        content = {"no-config": None, "not-json": b"{oops", "json-list": b"[1, 2]", "binary": b"\xff\xfe\x00"}[case]
        if content is not None:
            (target / "config.json").write_bytes(content)
    assert aot(["verify", str(target)]) == 2
    one_line_error(capsys.readouterr().err)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--device", "bogus"], "--device 'bogus': not a device"),
        (["--device", "cuda:7"], "--device 'cuda:7'"),
        (["--output-dir", "FILE/sub"], "is a file, so the folder cannot be created"),
        (["--update-card", "no/such/dir/README.md"], "--update-card"),
    ],
)
def test_eval_lm_bad_arguments_are_one_line_and_write_nothing(folder, tmp_path, extra, message, capsys):
    (tmp_path / "FILE").write_text("x")
    extra = [
        value.replace("FILE", str(tmp_path / "FILE")).replace("no/such", str(tmp_path / "no/such")) for value in extra
    ]
    out = ["--output-dir", str(tmp_path / "out")] if "--output-dir" not in extra else []
    assert aot(["eval", "lm", str(folder), *WIKI, *out, *extra]) == 2
    assert message in one_line_error(capsys.readouterr().err)
    assert not (tmp_path / "out").exists()


def test_malformed_card_is_refused_before_evaluating(folder, tmp_path, capsys):
    (folder / "README.md").write_text("---\n: : not yaml [\n---\n# card\n")
    before = (folder / "README.md").read_bytes()
    assert aot(["eval", "lm", str(folder), *WIKI, "--output-dir", str(tmp_path / "o"), "--update-card"]) == 2
    assert "cannot be read" in one_line_error(capsys.readouterr().err)
    assert (folder / "README.md").read_bytes() == before and not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    "content",
    [
        b"{oops",
        b"\xff\xfe",
        b"[]",
        b'{"results": []}',
        b'{"results": {"ptb": 3}}',
        b'{"results": {"ptb": {"loss": "low"}}}',
        b'{"results": {"ptb": {"loss": 1.0, "source": "x"}}}',
        b'{"results": {}, "settings": [1]}',
    ],
)
def test_eval_table_of_malformed_results_is_one_line(tmp_path, content, capsys):
    path = tmp_path / "results.json"
    path.write_bytes(content)
    assert aot(["eval", "table", str(path)]) == 2
    assert str(path) in one_line_error(capsys.readouterr().err)
    with pytest.raises(UsageError):
        read_results(path)


# --- pickles anywhere; `aot push` bad input is exit 2 --------------------------------------------------------


def test_verify_finds_pickles_at_any_depth_in_any_case_with_every_pickle_suffix(folder):
    for name in ("sub/deep/optimizer.pt", "WEIGHTS.BIN", "state.pickle", "a.Pkl", "b.pth", "c.ckpt"):
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"\x80\x04pickle")
    report = verify_folder(folder)
    assert report.pickle_files == sorted(
        ["sub/deep/optimizer.pt", "WEIGHTS.BIN", "state.pickle", "a.Pkl", "b.pth", "c.ckpt"]
    )
    assert report.code_ok and not report.ok


@pytest.mark.parametrize("case", ["missing", "file", "bad-json", "bad-repo-id", "bad-endpoint"])
def test_push_bad_input_is_one_line_exit_2_and_uploads_nothing(folder, tmp_path, fake_hub, case, capsys):
    target, repo, extra = folder, "someone/tiny", []
    if case == "bad-endpoint":
        extra = ["--endpoint", "hub.example.com"]
    elif case == "missing":
        target = tmp_path / "nothing"
    elif case == "file":
        target = folder / "config.json"
    elif case == "bad-json":
        (folder / "config.json").write_text("{oops")
    else:
        repo = "a/b/c"
    assert aot(["push", str(target), "--repo-id", repo, *extra]) == 2
    one_line_error(capsys.readouterr().err)
    assert fake_hub.calls == []


def test_push_uploads_a_rendered_card_for_a_folder_without_one(folder, fake_hub):
    """Positive control: the checks do not stop the card that push renders for a folder without one."""
    result = push_to_hub(folder, "someone/tiny")
    assert "README.md" in result.files and ("upload_file", "README.md") in fake_hub.calls


def test_verify_and_push_fail_a_lora_adapter_folder_holding_code(tmp_path, fake_hub, capsys):
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "base", "r": 4}))
    (adapter / "adapter_model.safetensors").write_bytes(b"weights")
    code, out, _ = verify_exit(adapter, capsys)
    assert code == 0 and "LoRA adapter folder" in out and "(base)" in out
    (adapter / "helper.py").write_text("print('hi')\n")
    assert verify_exit(adapter, capsys)[0] == 1
    with pytest.raises(UsageError, match="helper.py is not an aot-transformers code file"):
        push_to_hub(adapter, "someone/adapter")
    assert fake_hub.calls == []


# A folder with missing weights is not evaluated; an adapter whose local base is gone is not passed.


def test_eval_of_a_folder_whose_position_table_is_missing_is_refused(tmp_path, capsys):
    from safetensors.torch import load_file, save_file

    folder = save_model(tiny_aot(max_length=32), char_tokenizer(), tmp_path / "lm")
    weights = folder / "model.safetensors"
    save_file({k: v for k, v in load_file(weights).items() if "embed_positions" not in k}, weights, {"format": "pt"})
    code = aot(["eval", "lm", str(folder), *WIKI, "--output-dir", str(tmp_path / "eval")])
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if ": error: " in line]
    assert code == 2 and len(errors) == 1 and "model.embed_positions.weight" in errors[0], err
    assert "initialise at random" in err and not (tmp_path / "eval" / "results.json").exists()


def test_an_adapter_whose_local_base_no_longer_exists_fails_verify_and_push(tmp_path, capsys):
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    base = tmp_path / "runs" / "base" / "model"  # a local folder, since deleted
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": str(base), "r": 2}))
    (adapter / "adapter_model.safetensors").write_bytes(b"")
    assert aot(["verify", str(adapter)]) == 1
    assert "does not exist" in capsys.readouterr().err
    with pytest.raises(UsageError, match="does not exist"):
        push_to_hub(adapter, "someone/adapter", endpoint="http://127.0.0.1:9")
    base.mkdir(parents=True)  # the base back in place: it verifies
    assert aot(["verify", str(adapter)]) == 0


def test_verify_fails_and_push_refuses_a_folder_whose_weights_are_nan(folder, capsys):
    from safetensors.torch import load_file, save_file

    weights = load_file(folder / "model.safetensors")
    name = sorted(weights)[0]
    weights[name].view(-1)[0] = float("nan")  # a merged NaN adapter leaves such a folder: it loads without a word
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    code, out, _ = verify_exit(folder, capsys)
    assert code == 1 and f"NAN/INF  model.safetensors: {name}" in out and "FAILED" in out
    with pytest.raises(UsageError, match=f"model.safetensors: {name} holds NaN or inf"):
        push_to_hub(folder, "someone/nan", endpoint="http://127.0.0.1:9")


def test_a_code_sha256_that_is_not_a_mapping_fails_verify(folder, capsys):
    edit_json(folder / "config.json", code_sha256="0" * 64)
    assert aot(["verify", str(folder)]) == 1
    assert "`code_sha256` is not a mapping" in capsys.readouterr().out
