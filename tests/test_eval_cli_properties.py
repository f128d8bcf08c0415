"""Property-based tests of the evaluation commands (`aot eval lm`, `aot eval table`, `aot eval tasks`, `aot verify`):
whatever the arguments and folders, a run ends with exit code 0, 2 (bad input, one line) or — for `aot verify` — 1
(a failed check), and never with a traceback on stderr (the error contract).

Runs in-process through `aot_transformers.cli.main`; every data source is a local file, so no case reaches the
network. A few dozen examples per property keep the module at a few seconds.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aot_transformers.cli import main as aot
from support import FIXTURES, char_tokenizer, save_model, tiny_aot

SETTINGS = settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture], derandomize=True
)


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict[str, Path]:
    """Folders and files the random arguments pick from: a good model, broken ones, good and bad data files."""
    root = tmp_path_factory.mktemp("world")
    model = save_model(tiny_aot(max_length=32), char_tokenizer(), root / "model")
    tampered = Path(shutil.copytree(model, root / "tampered"))
    (tampered / "extra.py").write_text("raise SystemExit('must never run')\n")
    config = json.loads((tampered / "config.json").read_text())
    config["auto_map"]["AutoModelForCausalLM"] = "extra.Model"
    (tampered / "config.json").write_text(json.dumps(config))
    broken = root / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    (root / "empty").mkdir()
    (root / "file.txt").write_text("just a file\n")
    (root / "binary.bin").write_bytes(bytes(range(256)))
    (root / "ptb.test.txt").write_text(" the market fell sharply on monday \n traders said <unk> selling continued \n")
    (root / "lambada_test.jsonl").write_text('{"text": "she opened the door and saw the dog"}\n')
    (root / "bad.jsonl").write_text('{"text": "fine"}\nnot json\n')
    (root / "bad_card.md").write_text("---\n: [unclosed\n---\n# card\n")
    return {
        "root": root,
        "model": model,
        "tampered": tampered,
        "broken": broken,
        "empty": root / "empty",
        "file": root / "file.txt",
        "binary": root / "binary.bin",
        "missing": root / "missing" / "thing",
        "ptb": root / "ptb.test.txt",
        "lambada": root / "lambada_test.jsonl",
        "bad_jsonl": root / "bad.jsonl",
        "bad_card": root / "bad_card.md",
        "wikitext": FIXTURES / "wiki.test.raw",
        "cbt_cn": FIXTURES / "cbtest_CN_test_fixture.txt",
        "cbt_ne": FIXTURES / "cbtest_NE_test_fixture.txt",
    }


def run(argv: list[str], capsys) -> tuple[int, str]:
    """`aot ARGV` in-process: its exit code (argparse's own errors included) and its stderr."""
    capsys.readouterr()
    try:
        code = aot(argv)
    except SystemExit as exit_:  # argparse: --help (0) or a bad option (2)
        code = exit_.code if isinstance(exit_.code, int) else 2
    return code, capsys.readouterr().err


def check_contract(code: int, err: str, allowed: tuple[int, ...] = (0, 2)) -> None:
    assert code in allowed, err
    assert "Traceback" not in err, err
    if code == 2:  # bad input: one line saying what is wrong (progress bars of a started load aside)
        lines = [line for line in err.splitlines() if line.strip() and "it/s]" not in line and "%|" not in line]
        assert len(lines) == 1 and "error" in lines[0], err


PATH_KEYS = ["model", "tampered", "broken", "empty", "file", "binary", "missing"]
DATA_KEYS = ["good", "good", "good", "missing", "binary", "empty", "file", "bad_jsonl"]
TASKS = ["wikitext", "ptb", "lambada", "lambada_acc", "cbt_cn", "cbt_ne", "all", "wikitext,ptb", "bogus", "ptb,,ptb"]
# Mostly integers (in range or not), sometimes what argparse refuses.
INTS = st.one_of(
    st.integers(1, 40).map(str),
    st.integers(1, 40).map(str),
    st.integers(-3, 70).map(str),
    st.sampled_from(["x", "1.5", "", "1e3", "nan"]),
)


@st.composite
def eval_lm_arguments(draw) -> tuple[str, dict[str, str], list[tuple[str, str | None]]]:
    """(model key, data choice per dataset, options) for one `aot eval lm` run."""
    model = draw(st.sampled_from(["model", "model", "model", *PATH_KEYS]))
    good = draw(st.booleans())  # half the examples with good data everywhere, so that some runs go all the way
    data = {
        name: "good" if good else draw(st.sampled_from(DATA_KEYS))
        for name in ("wikitext", "ptb", "lambada", "cbt_cn", "cbt_ne")
    }
    options: list[tuple[str, str | None]] = [("--tasks", draw(st.sampled_from(TASKS)))]
    for option in ("--batch-size", "--max-length", "--stride", "--limit"):
        if draw(st.sampled_from([False, False, True])):
            options.append((option, draw(INTS)))
    if draw(st.booleans()):
        devices = ["cpu", "cpu", "cpu", "cpu:0", "bogus", "cuda", "cuda:3", "meta", "mps"]
        options.append(("--device", draw(st.sampled_from(devices))))
    options.append(("--output-dir", draw(st.sampled_from(["OUT", "OUT", "OUT", "FILE", "FILE/sub", "MODEL"]))))
    card = draw(st.sampled_from([None, None, None, "", "CARD", "MISSING/README.md", "BAD_CARD", "FILE"]))
    if card is not None:
        options.append(("--update-card", card))
    if draw(st.sampled_from([False, False, True])):
        options.append(("--tokenizer", draw(st.sampled_from(["MODEL", "EMPTY", "MISSING"]))))
    if draw(st.booleans()):
        options.append(("--trust-remote-code", None))
    if draw(st.booleans()):
        options.append(("--bf16", None))
    return model, data, options


@settings(SETTINGS, max_examples=40)
@given(arguments=eval_lm_arguments())
def test_eval_lm_any_arguments_follow_the_contract(world, arguments, capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("AOT_LOG_DIR", str(tmp_path / "logs"))
    model_key, data, options = arguments
    with tempfile.TemporaryDirectory(dir=tmp_path) as scratch:
        scratch = Path(scratch)
        model = world[model_key]
        if model_key == "model":  # a copy, so a card written by one example does not change the next
            model = Path(shutil.copytree(world["model"], scratch / "model"))
        shutil.copy(world["bad_card"], scratch / "bad_card.md")
        places = {
            "OUT": scratch / "out",
            "FILE": world["file"],
            "MODEL": model,
            "CARD": scratch / "card.md",
            "MISSING": world["missing"],
            "BAD_CARD": scratch / "bad_card.md",
            "EMPTY": world["empty"],
        }
        argv = ["eval", "lm", str(model), "--no-progress"]
        for name, choice in data.items():
            argv += ["--data", f"{name}={world[name] if choice == 'good' else world[choice]}"]
        for option, value in options:
            if value is not None:  # a placeholder (OUT, FILE/sub, …) becomes a path of this example
                head, slash, rest = value.partition("/")
                if head in places:
                    value = str(places[head]) + slash + rest
            argv += [option] if value is None else [option, value]
        code, err = run(argv, capsys)
        if os.environ.get("AOT_PROPERTY_TRACE"):
            print(code, err.strip().splitlines()[-1:] if err.strip() else "", file=sys.__stdout__)
        check_contract(code, err)
        if model_key == "tampered":
            assert code == 2 or "--trust-remote-code" in argv  # never trusted unasked


@settings(SETTINGS, max_examples=10)
@given(
    batch_size=st.integers(1, 8),
    max_length=st.integers(2, 32),
    stride_fraction=st.floats(0.01, 1.0),
    limit=st.integers(1, 3),
    tasks=st.sampled_from(["wikitext", "ptb,lambada_acc", "cbt_cn", "lambada"]),
)
def test_eval_lm_valid_settings_succeed(
    world, batch_size, max_length, stride_fraction, limit, tasks, capsys, tmp_path
):
    stride = max(1, int(max_length * stride_fraction))
    with tempfile.TemporaryDirectory(dir=tmp_path) as scratch:
        argv = ["eval", "lm", str(world["model"]), "--tasks", tasks, "--no-progress", "--output-dir", scratch]
        for name in ("wikitext", "ptb", "lambada", "cbt_cn", "cbt_ne"):
            argv += ["--data", f"{name}={world[name]}"]
        argv += ["--batch-size", str(batch_size), "--max-length", str(max_length), "--stride", str(stride)]
        code, err = run([*argv, "--limit", str(limit)], capsys)
        check_contract(code, err, allowed=(0,))
        results = json.loads((Path(scratch) / "results.json").read_text())["results"]
        assert sorted(results) == sorted(tasks.split(","))


JSON = st.recursive(
    st.none() | st.booleans() | st.floats(allow_nan=True) | st.integers() | st.text(max_size=8),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3),
    max_leaves=12,
)
RESULTS = st.fixed_dictionaries(
    {"results": st.dictionaries(st.sampled_from(["ptb", "wikitext", "lambada_acc", "x"]), JSON, max_size=3)},
    optional={"model": JSON, "settings": JSON, "model_info": JSON, "date": JSON},
)


@SETTINGS
@given(
    payloads=st.lists(st.one_of(RESULTS, JSON, st.binary(max_size=20)), min_size=1, max_size=3),
    names=st.one_of(st.none(), st.lists(st.text(min_size=1, max_size=5).filter(lambda s: not s.startswith("-")))),
)
def test_eval_table_any_results_files_follow_the_contract(payloads, names, capsys, tmp_path):
    with tempfile.TemporaryDirectory(dir=tmp_path) as scratch:
        paths = []
        for index, payload in enumerate(payloads):
            path = Path(scratch) / f"results{index}.json"
            if isinstance(payload, bytes):
                path.write_bytes(payload)
            else:
                path.write_text(json.dumps(payload))
            paths.append(str(path))
        argv = ["eval", "table", *paths] + (["--names", *names] if names else [])
        code, err = run(argv, capsys)
        check_contract(code, err)


@SETTINGS
# ("lm" is left out: `aot eval lm ptb` would look for a Hub model named ptb, a network call.)
@given(
    extra=st.lists(st.sampled_from(["--tasks", "x", "--help", "-v", "table", "--device", "cpu", "ptb"]), max_size=3)
)
def test_eval_tasks_and_paths_follow_the_contract(extra, capsys):
    for command in (["eval", "tasks"], ["eval", "lm-eval-path"], ["eval"], ["verify"]):
        code, err = run([*command, *extra], capsys)
        check_contract(code, err, allowed=(0, 1, 2) if command == ["verify"] else (0, 2))


FILE_NAMES = st.sampled_from(
    [
        "config.json",
        "tokenizer_config.json",
        "sub/config.json",
        "modeling_aot.py",
        "evil.py",
        "sub/x.py",
        "w.BIN",
        "a/b.pickle",
        "model.safetensors",
        "README.md",
        "preprocessor_config.json",
    ]
)


@SETTINGS
@given(
    files=st.dictionaries(FILE_NAMES, st.one_of(JSON, st.binary(max_size=16)), max_size=5),
    start=st.sampled_from(["model", "empty", "file", "missing", "broken"]),
)
def test_verify_any_folder_follows_the_contract(world, files, start, capsys, tmp_path):
    with tempfile.TemporaryDirectory(dir=tmp_path) as scratch:
        folder = Path(scratch) / "folder"
        if start in ("model", "empty", "broken"):
            shutil.copytree(world[start], folder)
        elif start == "file":
            folder.write_text("x")
        if folder.is_dir():
            for name, content in files.items():
                path = folder / name
                path.parent.mkdir(parents=True, exist_ok=True)
                if isinstance(content, bytes):
                    path.write_bytes(content)
                else:
                    path.write_text(json.dumps(content))
        code, err = run(["verify", str(folder)], capsys)
        check_contract(code, err, allowed=(0, 1, 2))
        if start != "model" or any(name.endswith((".py", ".BIN", ".pickle")) for name in files):
            assert code != 0, err  # nothing but an untouched export passes


class _RecordingHfApi:
    """A stand-in for `huggingface_hub.HfApi` that records uploads and sends nothing."""

    uploads: list = []

    def __init__(self, endpoint=None, token=None):
        self.endpoint = endpoint or "https://hub.invalid"

    def create_repo(self, repo_id, **kwargs):
        return f"{self.endpoint}/{repo_id}"

    def create_branch(self, *args, **kwargs):
        pass

    def upload_folder(self, **kwargs):
        _RecordingHfApi.uploads.append(kwargs["folder_path"])
        return type("Info", (), {"commit_url": "https://hub.invalid/commit/1", "oid": "1"})()

    def upload_file(self, **kwargs):
        return type("Info", (), {"commit_url": "https://hub.invalid/commit/2", "oid": "2"})()


@SETTINGS
@given(
    files=st.dictionaries(FILE_NAMES, st.one_of(JSON, st.binary(max_size=16)), max_size=3),
    start=st.sampled_from(["model", "model", "empty", "file", "missing", "broken"]),
    repo=st.sampled_from(["someone/tiny", "tiny", "a/b/c", "bad name", "", "-x/y"]),
    endpoint=st.sampled_from([None, None, "https://hub.invalid", "hub.invalid", ""]),
)
def test_push_any_folder_follows_the_contract(world, files, start, repo, endpoint, capsys, monkeypatch, tmp_path):
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "HfApi", _RecordingHfApi)
    _RecordingHfApi.uploads = []
    with tempfile.TemporaryDirectory(dir=tmp_path) as scratch:
        folder = Path(scratch) / "folder"
        if start in ("model", "empty", "broken"):
            shutil.copytree(world[start], folder)
        elif start == "file":
            folder.write_text("x")
        if folder.is_dir():
            for name, content in files.items():
                path = folder / name
                path.parent.mkdir(parents=True, exist_ok=True)
                if isinstance(content, bytes):
                    path.write_bytes(content)
                else:
                    path.write_text(json.dumps(content))
        argv = ["push", str(folder), "--repo-id", repo] + ([] if endpoint is None else ["--endpoint", endpoint])
        code, err = run(argv, capsys)
        check_contract(code, err)
        assert (code == 0) == bool(_RecordingHfApi.uploads)  # bad input: nothing uploaded
