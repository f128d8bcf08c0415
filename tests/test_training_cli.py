"""`aot train lm|image`, `aot push`, `aot demo` through `register` on a fresh parser."""

from __future__ import annotations

import argparse
import json

import pytest

pytest.importorskip("datasets")

from aot_transformers.training.arguments import (
    PublishArguments,
    parse_dataclasses,
)
from aot_transformers.training.cli import register
from aot_transformers.training.lm import LMModelArguments
from aot_transformers.training.text_data import TextDataArguments


@pytest.fixture
def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="aot")
    register(parser.add_subparsers(dest="command", required=True))
    return parser


def test_commands_exist(parser):
    args = parser.parse_args(["train", "lm", "--output_dir", "out", "--preset", "aot-mssa-l-tiny", "--bf16", "false"])
    assert args.arguments == ["--output_dir", "out", "--preset", "aot-mssa-l-tiny", "--bf16", "false"]
    assert parser.parse_args(["train", "image", "--help"]).arguments == ["--help"]
    push = parser.parse_args(["push", "folder", "--repo-id", "me/model", "--private"])
    assert (push.folder, push.repo_id, push.private) == ("folder", "me/model", True)
    demo = parser.parse_args(["demo", "--output-dir", "d", "--lm-epochs", "1"])
    assert (demo.output_dir, demo.lm_epochs) == ("d", 1.0)
    with pytest.raises(SystemExit):
        parser.parse_args(["train", "speech"])


def test_train_help_lists_our_and_every_trainer_flag(parser, capsys):
    args = parser.parse_args(["train", "lm", "--help"])
    with pytest.raises(SystemExit) as exited:
        args.func(args)
    assert exited.value.code == 0
    out = capsys.readouterr().out
    for flag in (
        "--tokenizer_vocab_size",
        "--block_size",
        "--streaming",
        "--hub_endpoint",
        "--learning_rate",
        "--gradient_accumulation_steps",
        "--fsdp",
        "--resume_from_checkpoint",
    ):
        assert flag in out


@pytest.mark.parametrize(
    "kind, arguments, message",
    [
        ("lm", ["--dataset_name", "MISSING/corpus.txt"], "no such file or folder"),
        ("lm", ["--preset", "aot-unknown"], "Unknown preset 'aot-unknown'"),
        ("image", ["--preset", "aot-unknown"], "Unknown preset 'aot-unknown'"),
        ("image", ["--dataset_name", "MISSING/images"], "no such file or folder"),
        ("lm", ["--warmup_ratio", "0.05"], "not used by the HfArgumentParser: ['--warmup_ratio', '0.05']"),
    ],
)
def test_setup_errors_exit_2_with_one_line(parser, capsys, tmp_path, kind, arguments, message):
    arguments = [a.replace("MISSING", str(tmp_path / "missing")) for a in arguments]
    args = parser.parse_args(["train", kind, "--output_dir", str(tmp_path / "out"), *arguments])
    assert args.func(args) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"aot train {kind}: error: ") and message in err
    assert err.count("\n") == 1  # one line, no traceback
    assert not (tmp_path / "out" / "model").exists()


def test_arguments_from_a_json_file(tmp_path):
    path = tmp_path / "args.json"
    path.write_text(
        json.dumps(
            {
                "output_dir": str(tmp_path),
                "preset": "aot-mhsa-l-tiny",
                "block_size": 64,
                "learning_rate": 1e-3,
                "hub_endpoint": "http://127.0.0.1:9",
            }
        )
    )
    model_args, data_args, publish_args, training_args = parse_dataclasses(
        (LMModelArguments, TextDataArguments, PublishArguments), [str(path)]
    )
    assert model_args.preset == "aot-mhsa-l-tiny" and data_args.block_size == 64
    assert publish_args.hub_endpoint == "http://127.0.0.1:9" and training_args.learning_rate == 1e-3
