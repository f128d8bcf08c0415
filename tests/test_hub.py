"""Model cards, atomic export and push — against a stand-in Hub server on loopback that records the requests."""

from __future__ import annotations

import base64
import hashlib
import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote

import pytest
import yaml

from aot_transformers import AoTConfig, AoTForCausalLM, AoTForImageClassification, export_model
from aot_transformers.errors import UsageError
from aot_transformers.hub import EXPORT_MANIFEST, HubPushError, check_export_folder, push_to_hub
from aot_transformers.model_card import card_for_folder, card_template, render_model_card
from support import tiny_config

# What the Hub's metadata validation accepts (a subset of its license list; the checks it makes on a model card).
HUB_LICENSES = {
    "apache-2.0", "mit", "bsd-3-clause", "bsd-2-clause", "cc-by-4.0", "cc-by-sa-4.0", "cc-by-nc-4.0", "gpl-3.0",
    "lgpl-3.0", "agpl-3.0", "openrail", "llama2", "llama3", "gemma", "other", "unknown",
}  # fmt: skip


def hub_metadata_errors(readme: str) -> list[str]:
    """The errors the Hub reports for a README's metadata: YAML front matter that parses to a mapping, `license`
    from its list, `base_model` as repository ids, `model-index` with name, task type, dataset and metrics."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    if not readme.startswith("---\n"):
        return []  # no metadata at all is allowed
    try:
        front, _ = readme[4:].split("\n---", 1)
        metadata = yaml.safe_load(front) or {}
    except (ValueError, yaml.YAMLError) as error:
        return [f"Invalid YAML front matter: {error}"]
    if not isinstance(metadata, dict):
        return ["Metadata must be a mapping"]
    errors = []
    license_ = metadata.get("license")
    if license_ is not None and license_ not in HUB_LICENSES:
        errors.append(f'"license" with value "{license_}" is not valid')
    bases = metadata.get("base_model")
    for base in [bases] if isinstance(bases, str) else bases or []:
        try:
            if not isinstance(base, str) or base.startswith((".", "/", "~")):
                raise HFValidationError(str(base))
            validate_repo_id(base)
        except HFValidationError:
            errors.append(f'"base_model" with value "{base}" is not valid. Use a model id from https://hf.co/models.')
    index = metadata.get("model-index")
    if index is not None:
        if not isinstance(index, list):
            errors.append('"model-index" must be an array')
        for model in index if isinstance(index, list) else []:
            if not isinstance(model, dict) or not isinstance(model.get("name"), str):
                errors.append('"model-index[].name" is required')
                continue
            for result in model.get("results") or []:
                task, dataset, metrics = result.get("task"), result.get("dataset"), result.get("metrics")
                if not isinstance(task, dict) or not isinstance(task.get("type"), str):
                    errors.append('"model-index[].results[].task.type" is required')
                if not isinstance(dataset, dict) or not all(isinstance(dataset.get(k), str) for k in ("type", "name")):
                    errors.append('"model-index[].results[].dataset" needs "type" and "name"')
                if not isinstance(metrics, list) or not metrics:
                    errors.append('"model-index[].results[].metrics" must be a non-empty array')
                for metric in metrics or []:
                    if not isinstance(metric.get("type"), str) or not isinstance(metric.get("value"), (int, float)):
                        errors.append('"model-index[].results[].metrics[]" needs "type" and a numeric "value"')
    return errors


class StandInHub:
    """A minimal Hub on 127.0.0.1 that keeps repositories: create repo and branch, preupload (every file
    'regular'), commit (adds and deletions, refused with 400 when README.md's metadata fails the Hub's validation),
    list the tree.

    Records every request as `(method, path, headers, body)`; `fail` maps a path fragment to an HTTP status to
    answer with instead (e.g. `{"/commit/": 500}`). `repos[(repo, branch)]` maps paths to contents.
    """

    def __init__(self, fail: dict[str, int] | None = None):
        self.requests: list[tuple[str, str, dict, bytes]] = []
        self.fail = dict(fail or {})
        self.repos: dict[tuple[str, str], dict[str, bytes]] = {}
        self.private: dict[str, bool] = {}
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _reply(self, status: int, payload):
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                hub.requests.append(("GET", self.path, dict(self.headers), b""))
                if "/tree/" in self.path:
                    repo, rest = self.path.split("/api/models/")[1].split("/tree/")
                    branch = unquote(rest.split("?")[0].split("/")[0])
                    files = hub.repos.get((repo, branch), {})
                    listing = [{"type": "file", "path": p, "size": len(c), "oid": "0" * 40} for p, c in files.items()]
                    return self._reply(200, listing)
                self._reply(404, {"error": "not found"})

            def do_POST(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                hub.requests.append(("POST", self.path, dict(self.headers), body))
                for fragment, status in hub.fail.items():
                    if fragment in self.path:
                        return self._reply(status, {"error": f"stand-in failure on {fragment}"})
                if self.path == "/api/repos/create":
                    request = json.loads(body)
                    repo = f"{request['organization']}/{request['name']}"
                    hub.repos.setdefault((repo, "main"), {})
                    hub.private[repo] = (
                        request.get("visibility", "private" if request.get("private") else "public") == "private"
                    )
                    return self._reply(200, {"url": f"{hub.url}/{repo}"})
                if self.path == "/api/validate-yaml":
                    errors = hub_metadata_errors(json.loads(body)["content"])
                    payload = {"errors": [{"message": e} for e in errors], "warnings": []}
                    return self._reply(400 if errors else 200, payload)
                if "/branch/" in self.path:
                    repo, branch = self.path.split("/api/models/")[1].split("/branch/")
                    hub.repos.setdefault((repo, unquote(branch)), dict(hub.repos.get((repo, "main"), {})))
                    return self._reply(200, {})
                if "/preupload/" in self.path:
                    files = json.loads(body)["files"]
                    return self._reply(
                        200,
                        {
                            "files": [
                                {"path": f["path"], "uploadMode": "regular", "shouldIgnore": False} for f in files
                            ]
                        },
                    )
                if "/commit/" in self.path:
                    repo, branch = self.path.split("/api/models/")[1].split("/commit/")
                    branch = unquote(branch.split("?")[0])
                    added, deleted = {}, []
                    for line in body.decode().splitlines():
                        entry = json.loads(line)
                        if entry["key"] == "file":
                            added[entry["value"]["path"]] = base64.b64decode(entry["value"]["content"])
                        elif entry["key"] in ("deletedFile", "deletedFolder"):
                            deleted.append(entry["value"]["path"])
                    if "README.md" in added:
                        errors = hub_metadata_errors(added["README.md"].decode())
                        if errors:
                            message = "Invalid metadata in README.md.\n" + "\n".join(f"- {e}" for e in errors)
                            return self._reply(400, {"error": message})
                    files = hub.repos.setdefault((repo, branch), {})
                    for path in deleted:
                        files.pop(path, None)
                    files.update(added)
                    oid = hashlib.sha1(body).hexdigest()
                    return self._reply(200, {"commitUrl": f"{hub.url}/{repo}/commit/{oid}", "commitOid": oid})
                return self._reply(404, {"error": "unknown route"})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()

    def paths(self) -> list[str]:
        return [path for _, path, _, _ in self.requests]

    def committed_files(self, repo: str | None = None, branch: str = "main") -> dict[str, bytes]:
        """Files of a repository branch (default: the one committed to last): path -> content."""
        if repo is None:
            path = next(path for _, path, _, _ in reversed(self.requests) if "/commit/" in path)
            repo, branch = path.split("/api/models/")[1].split("/commit/")
            branch = unquote(branch.split("?")[0])
        return dict(self.repos.get((repo, branch), {}))


@pytest.fixture
def hub():
    server = StandInHub()
    yield server
    server.close()


def folder_digest(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def card_metadata(text: str) -> dict:
    return yaml.safe_load(text.split("---")[1])


def lm_card(**overrides):
    fields = dict(
        model_name="aot-tiny",
        repo_id="someone/aot-tiny",
        datasets=["wikitext"],
        results=[{"metric": "perplexity", "value": 42.5, "split": "validation", "dataset": "wikitext"}],
        training={"learning rate": 3e-3, "steps": 100},
        num_parameters=123_456,
        curves_file="training_curves.png",
    )
    fields.update(overrides)
    return render_model_card(tiny_config(knn_k=4), **fields)


# --------------------------------------------------------------------------------------------------------------
# cards
# --------------------------------------------------------------------------------------------------------------


def test_card_template_is_a_file_of_the_package_itself():
    from importlib import resources

    template = resources.files("aot_transformers").joinpath("model_card_template.md")
    assert template.is_file() and not Path(str(template)).is_symlink()  # package data, no link out of the package
    assert card_template() == template.read_text(encoding="utf-8") and "{{ card_data }}" in card_template()


def test_card_for_a_folder_carries_training_and_aot_eval_results(tmp_path):
    folder = export_model(AoTForCausalLM(tiny_config()), tmp_path / "m")
    results = {
        "validation": {"perplexity": 9.5, "source": {"type": "training", "path": "tiny-corpus"}},
        "ptb": {"loss": 5.1, "acc": "not a number", "source": {"type": "file", "path": "/data/ptb.valid.txt"}},
    }
    (folder / "results.json").write_text(json.dumps({"results": results, "settings": {"max_length": 64}}))
    metadata = yaml.safe_load(str(card_for_folder(folder, "me/m")).split("---")[1])
    metrics = {(r["dataset"]["name"], m["type"], m["value"]) for r in metadata["model-index"][0]["results"]
               for m in r["metrics"]}  # fmt: skip
    assert metrics == {("tiny-corpus", "perplexity", 9.5), ("Penn Treebank (ptb.valid.txt)", "loss", 5.1)}
    (folder / "results.json").write_text('{"results": {"ptb": 3}}')
    with pytest.raises(UsageError, match="results.json: not an `aot eval` results file"):
        card_for_folder(folder)


def test_lm_card_metadata_and_sections():
    card = str(lm_card())
    metadata = card_metadata(card)
    assert metadata["library_name"] == "transformers"
    assert metadata["pipeline_tag"] == "text-generation"
    assert {"custom_code", "aot", "attention-only"} <= set(metadata["tags"])
    assert metadata["datasets"] == ["wikitext"]
    result = metadata["model-index"][0]["results"][0]
    assert result["metrics"][0] == {"type": "perplexity", "value": 42.5}
    assert result["dataset"]["split"] == "validation"
    assert "| num_hidden_layers | 2 |" in card and "| parameters | 123,456 |" in card
    assert "knn_k=4" in card  # the k-NN note
    assert "trust_remote_code=True" in card and "revision=revision" in card
    assert "`transformers>=5.24,<6` is needed" in card  # the versions the shipped code runs on
    assert "| learning rate | 0.003 |" in card
    assert "![training curves](training_curves.png)" in card


def test_image_card_and_card_without_results():
    config = AoTForImageClassification(tiny_config()).config
    config.architectures = ["AoTForImageClassification"]
    card = str(render_model_card(config, model_name="clf"))
    metadata = card_metadata(card)
    assert metadata["pipeline_tag"] == "image-classification"
    assert "model-index" not in metadata
    assert 'pipeline("image-classification"' in card and "| num_labels | 5 |" in card


# --------------------------------------------------------------------------------------------------------------
# export
# --------------------------------------------------------------------------------------------------------------


def test_export_writes_card_and_extra_files(tmp_path):
    target = export_model(
        AoTForCausalLM(tiny_config()),
        tmp_path / "out",
        model_card=lm_card(),
        extra_files={"results.json": "{}", "bytes.bin": b"\x00\x01"},
    )
    assert (target / "README.md").read_text().startswith("---")
    assert (target / "bytes.bin").read_bytes() == b"\x00\x01"
    check_export_folder(target)


def test_failed_export_leaves_the_previous_folder_intact(tmp_path):
    target = export_model(AoTForCausalLM(tiny_config()), tmp_path / "out")
    before = folder_digest(target)
    with pytest.raises(FileNotFoundError):
        export_model(AoTForCausalLM(tiny_config()), target, extra_files={"x": Path(tmp_path / "missing")})
    assert folder_digest(target) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no staging folder left behind


# --------------------------------------------------------------------------------------------------------------
# push
# --------------------------------------------------------------------------------------------------------------


@pytest.fixture
def exported(tmp_path) -> Path:
    return export_model(AoTForCausalLM(tiny_config()), tmp_path / "tiny-model")


def test_push_creates_repo_and_commits_every_file(hub, exported):
    before = folder_digest(exported)
    result = push_to_hub(exported, "someone/tiny", token="hf_test", endpoint=hub.url)
    paths = hub.paths()
    assert paths[0] == "/api/repos/create"
    assert any(p == "/api/models/someone/tiny/preupload/main" for p in paths)
    assert paths[-1] == "/api/models/someone/tiny/commit/main"
    create = json.loads(hub.requests[0][3])
    assert create == {"name": "tiny", "organization": "someone", "type": "model"}
    assert hub.requests[0][2]["authorization"] == "Bearer hf_test"
    files = hub.committed_files()
    assert EXPORT_MANIFEST in before  # the export's own bookkeeping stays local, as every hidden file
    pushed = {name: digest for name, digest in before.items() if name != EXPORT_MANIFEST}
    assert set(pushed) | {"README.md"} == set(files)
    for name, digest in pushed.items():
        assert hashlib.sha256(files[name]).hexdigest() == digest
    assert "custom_code" in card_metadata(files["README.md"].decode())["tags"]  # rendered from config.json
    assert folder_digest(exported) == before  # the card was uploaded from memory, not written locally
    assert result.commit_oid and result.commit_url.endswith(result.commit_oid)
    assert "README.md" in result.files


def test_push_keeps_an_existing_card(hub, exported):
    (exported / "README.md").write_text("---\nlicense: mit\n---\nmy card\n")
    push_to_hub(exported, "someone/tiny", token="hf_test", endpoint=hub.url)
    assert hub.committed_files()["README.md"] == b"---\nlicense: mit\n---\nmy card\n"


# 5xx answers are retried with back-off by huggingface_hub on some routes: 4xx keeps the test fast there.
@pytest.mark.parametrize("failing, status", [("/commit/", 500), ("/preupload/", 403), ("/api/repos/create", 401)])
def test_push_failure_leaves_the_folder_intact_and_says_why(exported, failing, status):
    hub = StandInHub(fail={failing: status})
    try:
        before = folder_digest(exported)
        with pytest.raises(HubPushError) as raised:
            push_to_hub(exported, "someone/tiny", token="hf_test", endpoint=hub.url)
        message = str(raised.value)
        assert "someone/tiny" in message and hub.url in message and str(status) in message
        assert "local folder is unchanged" in message
        assert folder_digest(exported) == before
    finally:
        hub.close()


def test_push_to_unreachable_endpoint_is_a_clear_error(exported):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed once the block ends: nothing listens there
    before = folder_digest(exported)
    with pytest.raises(HubPushError, match="local folder is unchanged"):
        push_to_hub(exported, "someone/tiny", token="hf_test", endpoint=f"http://127.0.0.1:{port}")
    assert folder_digest(exported) == before


def test_push_refuses_what_is_not_an_export(tmp_path, hub):
    (tmp_path / "config.json").write_text(json.dumps(AoTConfig().to_dict()))
    with pytest.raises(ValueError, match="does not load with trust_remote_code=True"):
        push_to_hub(tmp_path, "someone/x", endpoint=hub.url)
    # Bad input is a UsageError (a ValueError; `aot push` exits with 2), not FileNotFoundError (exit 1)
    with pytest.raises(UsageError, match="no such folder"):
        push_to_hub(tmp_path / "missing", "someone/x", endpoint=hub.url)
    with pytest.raises(UsageError, match="not a Hub repository id"):
        push_to_hub(export_model(AoTForCausalLM(tiny_config()), tmp_path / "m"), "a/b/c", endpoint=hub.url)
    assert hub.requests == []  # nothing reached the server


def test_push_command(hub, exported, capsys):
    import argparse

    from aot_transformers.training.cli import register

    parser = argparse.ArgumentParser(prog="aot")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(
        [
            "push",
            str(exported),
            "--repo-id",
            "someone/tiny",
            "--endpoint",
            hub.url,
            "--token",
            "hf_test",
            "--commit-message",
            "first",
        ]
    )
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert "commit:" in out and "revision=" in out
    commits = [json.loads(body.decode().splitlines()[0]) for _, path, _, body in hub.requests if "/commit/" in path]
    # the folder in one commit with the given message, then the card rendered from memory (the folder had none)
    assert [c["value"]["summary"] for c in commits] == ["first", "Add the model card"]
    from aot_transformers.cli import main as aot

    failing = StandInHub(fail={"/commit/": 403})
    try:  # a push the server refuses: a failed run (exit 1), one line
        assert aot(["push", str(exported), "--repo-id", "someone/tiny", "--endpoint", failing.url]) == 1
        err = capsys.readouterr().err
        assert err.startswith("aot push: error: ") and "local folder is unchanged" in err and err.count("\n") == 1
    finally:
        failing.close()
    # bad input: exit 2, nothing sent
    assert aot(["push", str(exported), "--repo-id", "a/b/c", "--endpoint", hub.url]) == 2
    assert "--repo-id 'a/b/c': not a Hub repository id" in capsys.readouterr().err


def test_training_with_push_to_hub_uploads_the_final_folder(hub, tmp_path):
    pytest.importorskip("datasets")
    from transformers import TrainingArguments

    from aot_transformers.training.arguments import PublishArguments
    from aot_transformers.training.lm import LMModelArguments, train_lm
    from aot_transformers.training.text_data import TextDataArguments

    train_lm(
        LMModelArguments(
            preset="aot-mssa-l-tiny",
            config_overrides="hidden_size=32,num_hidden_layers=1,vocab_size=300",
            tokenizer_vocab_size=300,
        ),
        TextDataArguments(block_size=32),
        TrainingArguments(
            output_dir=str(tmp_path / "run"),
            max_steps=2,
            report_to="none",
            use_cpu=True,
            save_strategy="no",
            disable_tqdm=True,
            push_to_hub=True,
            hub_model_id="someone/trained",
            hub_token="hf_test",
        ),
        PublishArguments(hub_endpoint=hub.url, make_plots=False),
    )
    files = hub.committed_files()
    assert {"config.json", "model.safetensors", "tokenizer.json", "README.md", "modeling_aot.py"} <= set(files)
    metadata = card_metadata(files["README.md"].decode())
    assert metadata["model-index"][0]["name"] == "trained"
    assert metadata["model-index"][0]["results"][0]["metrics"][0]["type"] == "perplexity"


def test_failed_push_after_training_keeps_the_final_folder(tmp_path, capsys):
    pytest.importorskip("datasets")
    from aot_transformers.training.lm import main

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    status = main([
        "--preset", "aot-mssa-l-tiny", "--config_overrides", "hidden_size=32,num_hidden_layers=1,vocab_size=300",
        "--tokenizer_vocab_size", "300", "--block_size", "32", "--max_steps", "1", "--report_to", "none",
        "--use_cpu", "--save_strategy", "no", "--disable_tqdm", "true", "--make_plots", "false",
        "--output_dir", str(tmp_path / "run"), "--push_to_hub", "--hub_model_id", "someone/x",
        "--hub_endpoint", f"http://127.0.0.1:{port}",
    ])  # fmt: skip
    assert status == 1
    assert "local folder is unchanged" in capsys.readouterr().err
    check_export_folder(tmp_path / "run" / "model")


# --------------------------------------------------------------------------------------------------------------
# what the Hub accepts
# --------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "metadata, error",
    [
        ("base_model: runs/lm/model", '"base_model" with value "runs/lm/model" is not valid'),
        ("license: apache", '"license" with value "apache" is not valid'),
        ("model-index:\n- name: x\n  results:\n  - task: {}\n    metrics: []", "task.type"),
        ("tags: [a\n", "Invalid YAML"),
    ],
)
def test_stand_in_hub_refuses_a_card_the_hub_refuses(hub, exported, metadata, error):
    (exported / "README.md").write_text(f"---\n{metadata}\n---\n# card\n")
    with pytest.raises(HubPushError, match="Invalid metadata in README.md") as raised:
        push_to_hub(exported, "someone/tiny", token="hf_test", endpoint=hub.url)
    assert error in str(raised.value)
    assert hub.committed_files("someone/tiny") == {}  # nothing was committed


def test_rendered_cards_pass_the_hubs_validation():
    for card in (lm_card(), lm_card(base_model="openai-community/gpt2"), lm_card(base_model_description="runs/a/m")):
        assert hub_metadata_errors(str(card)) == []
    assert "base_model: openai-community/gpt2" in str(lm_card(base_model="openai-community/gpt2"))
    local = str(lm_card(base_model_description="runs/lm/model"))
    assert "base_model" not in local.split("---")[1] and "a local checkpoint (`model`)" in local
    with pytest.raises(ValueError, match="not a Hub repository id"):
        lm_card(base_model="runs/lm/model")


def test_push_uploads_eval_results_and_leaves_local_state_behind(hub, exported):
    (exported / ".eval_results").mkdir()
    (exported / ".eval_results" / "aot-eval.yaml").write_text("- dataset: {id: a/b, task_id: t}\n  value: 1.0\n")
    (exported / ".cache").mkdir(exist_ok=True)  # the export's manifest is in .cache/huggingface/
    (exported / ".cache" / "x").write_text("local")
    (exported / "checkpoint-2").mkdir()
    (exported / "checkpoint-2" / "optimizer.pt").write_bytes(b"pickle")
    (exported / "training_args.bin").write_bytes(b"pickle")
    (exported / "notes.pkl").write_bytes(b"pickle")
    (exported / "sub").mkdir()
    (exported / "sub" / ".hidden").write_text("x")
    result = push_to_hub(exported, "someone/tiny", token="hf_test", endpoint=hub.url)
    files = set(hub.committed_files("someone/tiny"))
    assert ".eval_results/aot-eval.yaml" in files and "model.safetensors" in files
    left_out = {".cache/x", "checkpoint-2/optimizer.pt", "training_args.bin", "notes.pkl", "sub/.hidden"}
    assert not files & left_out and not set(result.files) & left_out


def test_a_trainer_output_folder_is_pushed_without_training_args_and_verify_says_what_to_do(hub, tmp_path, caplog):
    from transformers import Trainer, TrainingArguments

    from aot_transformers.verify import verify_folder

    folder = tmp_path / "trainer"
    args = TrainingArguments(str(folder), report_to=[], use_cpu=True)
    Trainer(model=AoTForCausalLM(tiny_config()), args=args).save_model(str(folder))
    assert (folder / "training_args.bin").is_file()
    problems = verify_folder(folder).problems()
    assert problems == [
        "training_args.bin is a pickle (Trainer's pickled TrainingArguments: loading the model never reads it and "
        "`aot push` leaves it out; delete it (or move it out of the folder) to pass)"
    ]
    with caplog.at_level("WARNING", logger="aot_transformers.hub"):
        result = push_to_hub(folder, "someone/trained", token="hf_test", endpoint=hub.url)
    notices = [record.getMessage() for record in caplog.records if record.name == "aot_transformers.hub"]
    assert len(notices) == 1 and notices[0].startswith("Leaving training_args.bin out of the push")
    files = set(hub.committed_files("someone/trained"))
    assert "training_args.bin" not in files | set(result.files) and {"model.safetensors", "README.md"} <= files
    (folder / "training_args.bin").unlink()
    assert verify_folder(folder).ok


def test_push_to_a_branch_of_a_private_repo(hub, exported):
    push_to_hub(exported, "someone/tiny", token="hf_test", endpoint=hub.url, private=True, revision="v1")
    assert hub.private["someone/tiny"] is True
    assert "config.json" in hub.committed_files("someone/tiny", "v1")
    assert hub.committed_files("someone/tiny", "main") == {}


def _train_with_hub(tmp_path, hub, **overrides):
    from transformers import TrainingArguments

    from aot_transformers.training.arguments import PublishArguments
    from aot_transformers.training.lm import LMModelArguments, train_lm
    from aot_transformers.training.text_data import TextDataArguments

    fields = dict(
        output_dir=str(tmp_path / "run"), max_steps=4, save_strategy="steps", save_steps=2, report_to="none",
        use_cpu=True, disable_tqdm=True, push_to_hub=True, hub_model_id="someone/trained", hub_token="hf_test",
    )  # fmt: skip
    fields.update(overrides)
    train_lm(
        LMModelArguments(
            preset="aot-mssa-l-tiny", config_overrides="hidden_size=32,num_hidden_layers=1,vocab_size=300",
            tokenizer_vocab_size=300,
        ),
        TextDataArguments(block_size=32),
        TrainingArguments(**fields),
        PublishArguments(hub_endpoint=hub.url, make_plots=False),
    )  # fmt: skip
    return [
        json.loads(body.decode().splitlines()[0])["value"]["summary"]
        for _, p, _, body in hub.requests
        if "/commit/" in p
    ]


@pytest.mark.parametrize("strategy", ["end", "every_save", "checkpoint", "all_checkpoints"])
def test_hub_strategy_is_honoured(hub, tmp_path, strategy):
    pytest.importorskip("datasets")
    commits = _train_with_hub(tmp_path, hub, hub_strategy=strategy, hub_private_repo=True, hub_revision="dev")
    files = hub.committed_files("someone/trained", "dev")
    assert hub.private["someone/trained"] is True and hub.committed_files("someone/trained", "main") == {}
    assert commits[-1] == "End of training" and "README.md" in files and "model.safetensors" in files
    saves = [c for c in commits if c.startswith("Training in progress")]
    if strategy == "end":
        assert saves == []
    else:
        assert saves == ["Training in progress, step 2", "Training in progress, step 4"]
    if strategy == "checkpoint":
        assert {"last-checkpoint/optimizer.pt", "last-checkpoint/trainer_state.json"} <= set(files)
        state = json.loads(files["last-checkpoint/trainer_state.json"])
        assert state["global_step"] == 4  # the previous checkpoint was replaced
    if strategy == "all_checkpoints":
        assert {"checkpoint-2/model.safetensors", "checkpoint-4/optimizer.pt"} <= set(files)
    if strategy == "every_save":
        assert not any(name.startswith(("optimizer", "last-checkpoint", "checkpoint-")) for name in files)


def test_unknown_hub_strategy_and_bad_repo_id_are_refused(tmp_path, capsys):
    pytest.importorskip("datasets")
    from aot_transformers.training.lm import main

    base = ["--preset", "aot-mssa-l-tiny", "--max_steps", "1", "--use_cpu", "--report_to", "none",
            "--output_dir", str(tmp_path / "run"), "--push_to_hub"]  # fmt: skip
    assert main([*base, "--hub_model_id", "a/b/c"]) == 2
    assert "--hub_model_id 'a/b/c': not a Hub repository id" in capsys.readouterr().err
    assert not (tmp_path / "run" / "model").exists()


def test_evaluation_results_go_to_model_index_and_eval_results(tmp_path):
    from aot_transformers.evaluation import EvaluationReport, update_model_card

    report = EvaluationReport(
        model="m",
        results={
            "wikitext": {"loss": 4.2, "perplexity": 66.7, "source": {"type": "hub", "path": "Salesforce/wikitext",
                                                                    "name": "wikitext-103-raw-v1", "split": "test"}},
            "ptb": {"loss": 5.1, "source": {"type": "file", "path": "/data/ptb.valid.txt"}},
        },
        settings={"max_length": 1024, "stride": 1024},
        date="2026-01-01T00:00:00Z",
    )  # fmt: skip
    card = update_model_card(tmp_path, report)
    assert hub_metadata_errors(card.read_text()) == []
    entries = yaml.safe_load((tmp_path / ".eval_results" / "aot-eval.yaml").read_text())
    assert {(e["dataset"]["id"], e["dataset"]["task_id"], e["value"]) for e in entries} == {
        ("Salesforce/wikitext", "wikitext", 4.2),
        ("Salesforce/wikitext", "wikitext", 66.7),
    }  # local files have no Hub benchmark id: model-index only
    assert all(e["notes"].startswith(("loss;", "perplexity;")) for e in entries)
