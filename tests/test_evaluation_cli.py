"""`aot eval …` end to end on a tiny saved model: results files, model card, and clear errors on bad input."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from huggingface_hub import EvalResult, ModelCard, ModelCardData

from aot_transformers.evaluation import evaluate_model, read_results, update_model_card
from aot_transformers.evaluation.cli import register
from aot_transformers.model_card import SECTION_START
from support import FIXTURES, char_tokenizer, save_model, tiny_aot


def run(argv: list[str]) -> int:
    """Parse and run `aot …` with a parser holding only our `eval` group (as `aot_transformers.cli` wires it)."""
    parser = argparse.ArgumentParser(prog="aot")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_model(tiny_aot(max_length=32), char_tokenizer(), tmp_path_factory.mktemp("model") / "tiny-aot")


@pytest.fixture
def data_args(tmp_path):
    ptb = tmp_path / "ptb.test.txt"
    ptb.write_text(" the market fell sharply on monday \n traders said <unk> selling continued \n")
    lambada = tmp_path / "lambada_test.jsonl"
    lambada.write_text('{"text": "she opened the door and saw the dog"}\n{"text": "he read the book"}\n')
    return [
        *("--data", f"ptb={ptb}"),
        *("--data", f"lambada={lambada}"),
        *("--data", f"wikitext={FIXTURES / 'wiki.test.raw'}"),
        *("--data", f"cbt_cn={FIXTURES / 'cbtest_CN_test_fixture.txt'}"),
        *("--data", f"cbt_ne={FIXTURES / 'cbtest_NE_test_fixture.txt'}"),
    ]


def test_eval_lm_writes_results_and_the_model_card(model_dir, data_args, tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["eval", "lm", str(model_dir), "--tasks", "all", *data_args, "--output-dir", str(out), "--no-progress"]
    assert run([*argv, "--batch-size", "4", "--stride", "16", "--update-card"]) == 0
    results = json.loads((out / "results.json").read_text())
    assert list(results["results"]) == ["wikitext", "ptb", "lambada", "lambada_acc", "cbt_cn", "cbt_ne"]
    assert results["settings"]["max_length"] == 32 and results["settings"]["stride"] == 16
    assert results["model_info"]["model_type"] == "aot"
    assert 0 < results["results"]["ptb"]["loss"] < 10
    assert results["results"]["cbt_cn"]["examples"] == 2
    table = (out / "results.md").read_text()
    assert "| Model | Params | LAMBADA loss ↓ | PTB loss ↓ | WikiText loss ↓ | LAMBADA acc ↑" in table
    assert "wrote" in capsys.readouterr().out

    card = ModelCard.load(model_dir / "README.md")
    by_metric = {(r.dataset_name, r.metric_type): r.metric_value for r in card.data.eval_results}
    assert by_metric[("Penn Treebank (ptb.test.txt)", "loss")] == pytest.approx(results["results"]["ptb"]["loss"])
    assert by_metric[("Children's Book Test (CN) (cbtest_CN_test_fixture.txt)", "accuracy")] == pytest.approx(
        results["results"]["cbt_cn"]["acc"]
    )
    assert card.data.model_name == "tiny-aot"
    assert "model-index" in (model_dir / "README.md").read_text()

    # a second run replaces its own entries and table, nothing else
    count = len(card.data.eval_results)
    assert run([*argv, "--update-card"]) == 0
    text = (model_dir / "README.md").read_text()
    assert len(ModelCard.load(model_dir / "README.md").data.eval_results) == count
    assert text.count(SECTION_START) == 1


def test_update_model_card_keeps_other_content(model_dir, tmp_path):
    card_path = tmp_path / "README.md"
    other = EvalResult(
        task_type="text-generation",
        dataset_type="hellaswag",
        dataset_name="HellaSwag",
        metric_type="acc",
        metric_value=0.3,
    )
    data = ModelCardData(license="apache-2.0", model_name="mine", eval_results=[other])
    card_path.write_text(f"---\n{data.to_yaml()}\n---\n\n# Mine\n\nHand-written notes.\n")
    ptb = tmp_path / "ptb.test.txt"
    ptb.write_text(" a short sentence \n")
    report = evaluate_model(str(model_dir), ["ptb"], data={"ptb": ptb})
    update_model_card(card_path, report)
    card = ModelCard.load(card_path)
    assert card.data.license == "apache-2.0" and card.data.model_name == "mine"
    assert "Hand-written notes." in card.text
    assert {r.dataset_type for r in card.data.eval_results} == {"hellaswag", "ptb-text-only/ptb_text_only"}


def test_unknown_task_lists_valid_ones_and_writes_nothing(model_dir, tmp_path, capsys):
    out = tmp_path / "out"
    assert run(["eval", "lm", str(model_dir), "--tasks", "ptb,hellaswag", "--output-dir", str(out)]) == 2
    error = capsys.readouterr().err
    assert "unknown task(s) ['hellaswag']" in error and "wikitext, ptb, lambada, lambada_acc, cbt_cn, cbt_ne" in error
    assert not out.exists()


def test_wrong_format_names_the_line_and_keeps_old_results(model_dir, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.json").write_text('{"old": true}\n')
    bad = tmp_path / "lambada.jsonl"
    bad.write_text('{"text": "a fine passage"}\n{"text": "fine again"}\nthis is not json\n')
    argv = ["eval", "lm", str(model_dir), "--tasks", "lambada_acc", "--data", f"lambada_acc={bad}"]
    assert run([*argv, "--output-dir", str(out)]) == 2
    assert f"{bad}, line 3: not JSON" in capsys.readouterr().err
    assert json.loads((out / "results.json").read_text()) == {"old": True}
    assert sorted(p.name for p in out.iterdir()) == ["results.json"]


def test_crash_during_evaluation_keeps_results_and_card(model_dir, data_args, tmp_path, capsys, monkeypatch):
    """A task that crashes mid-run (here: the model raises on the second task) leaves the earlier results files and
    the model card byte for byte as they were, and the error names the failing task and the finished ones."""
    from aot_transformers.evaluation import tasks as task_module

    out = tmp_path / "out"
    argv = ["eval", "lm", str(model_dir), "--tasks", "ptb,lambada,cbt_cn", *data_args, "--output-dir", str(out)]
    assert run([*argv, "--no-progress", "--update-card"]) == 0
    before = {path.name: path.read_bytes() for path in [*out.iterdir(), model_dir / "README.md"]}

    real = task_module.run_task

    def crash_on_lambada(scorer, task, *args, **kwargs):
        if task == "lambada":
            raise RuntimeError("simulated out-of-memory in forward")
        return real(scorer, task, *args, **kwargs)

    monkeypatch.setattr("aot_transformers.evaluation.runner.run_task", crash_on_lambada)
    monkeypatch.setenv("AOT_LOG_DIR", str(tmp_path / "logs"))
    assert run([*argv, "--no-progress", "--update-card"]) == 1
    error = capsys.readouterr().err
    assert "task 'lambada' failed with RuntimeError: simulated out-of-memory in forward" in error
    assert "tasks finished before it: ptb" in error and "Nothing was written" in error
    # The error contract: one line on the terminal, the crash's traceback kept in a log file (or behind --debug).
    assert "Traceback" not in error
    (log,) = (tmp_path / "logs").iterdir()
    assert str(log) in error and "simulated out-of-memory in forward" in log.read_text()
    after = {path.name: path.read_bytes() for path in [*out.iterdir(), model_dir / "README.md"]}
    assert after == before


def test_model_without_tokenizer(tmp_path, capsys):
    bare = save_model(tiny_aot(max_length=32), None, tmp_path / "bare")
    data = ["--data", f"wikitext={FIXTURES / 'wiki.test.raw'}", "--output-dir", str(tmp_path / "out")]
    assert run(["eval", "lm", str(bare), "--tasks", "wikitext", *data]) == 2
    assert "no tokenizer could be loaded" in capsys.readouterr().err
    tokenizer = tmp_path / "tokenizer"
    char_tokenizer().save_pretrained(tokenizer)
    assert run(["eval", "lm", str(bare), "--tasks", "wikitext", "--tokenizer", str(tokenizer), *data]) == 0


def test_window_settings_beyond_the_model_are_errors(model_dir, tmp_path, capsys):
    data = ["--data", f"wikitext={FIXTURES / 'wiki.test.raw'}", "--output-dir", str(tmp_path / "out")]
    assert run(["eval", "lm", str(model_dir), "--tasks", "wikitext", "--max-length", "64", *data]) == 2
    assert "longer than the model's context window (32 positions)" in capsys.readouterr().err
    assert run(["eval", "lm", str(model_dir), "--tasks", "wikitext", "--stride", "0", *data]) == 2
    assert not (tmp_path / "out").exists()


def test_update_card_of_a_hub_model_needs_a_path(tmp_path, capsys):
    assert run(["eval", "lm", "someone/some-model", "--tasks", "ptb", "--update-card"]) == 2
    assert "give the card's path" in capsys.readouterr().err


def test_table_tasks_and_lm_eval_path(model_dir, tmp_path, capsys):
    for name in ("a", "b"):
        argv = [
            "eval",
            "lm",
            str(model_dir),
            "--tasks",
            "wikitext",
            "--data",
            f"wikitext={FIXTURES / 'wiki.test.raw'}",
        ]
        assert run([*argv, "--output-dir", str(tmp_path / name), "--no-progress"]) == 0
    capsys.readouterr()
    assert (
        run(
            [
                "eval",
                "table",
                str(tmp_path / "a" / "results.json"),
                str(tmp_path / "b" / "results.json"),
                "--names",
                "first",
                "second",
            ]
        )
        == 0
    )
    table = capsys.readouterr().out
    assert "| first |" in table and "| second |" in table
    assert read_results(tmp_path / "a" / "results.json").results["wikitext"]["documents"] == 2

    assert run(["eval", "tasks"]) == 0
    assert "cbt_ne" in capsys.readouterr().out
    assert run(["eval", "lm-eval-path"]) == 0
    folder = capsys.readouterr().out.strip()
    assert (Path(folder) / "aot_ptb.yaml").is_file()


def test_the_aot_command_has_eval():
    from aot_transformers.cli import build_parser

    args = build_parser().parse_args(["eval", "lm", "model", "--tasks", "ptb"])
    assert args.tasks == "ptb" and callable(args.func)


def test_missing_model_folder(tmp_path, capsys):
    argv = ["eval", "lm", str(tmp_path / "no" / "such" / "model"), "--tasks", "wikitext"]
    assert run([*argv, "--data", f"wikitext={FIXTURES / 'wiki.test.raw'}", "--output-dir", str(tmp_path / "o")]) == 2
    assert "model folder not found" in capsys.readouterr().err
