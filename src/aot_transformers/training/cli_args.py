"""Argument parsing shared by the training entry points: our dataclasses plus every `TrainingArguments` flag
through `HfArgumentParser`, from the command line or one .json / .yaml file, and clear one-line errors."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from .common import TrainingSetupError


def parse_dataclasses(classes: tuple[type, ...], argv: list[str] | None = None) -> tuple[Any, ...]:
    """Parse `(*classes, TrainingArguments)` from `argv` (default `sys.argv[1:]`); a single `.json`, `.yaml` or
    `.yml` argument is read as a file of arguments instead."""
    from transformers import HfArgumentParser, TrainingArguments

    parser = HfArgumentParser((*classes, TrainingArguments))
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if len(argv) == 1 and argv[0].endswith(".json"):
            return parser.parse_json_file(json_file=argv[0])
        if len(argv) == 1 and argv[0].endswith((".yaml", ".yml")):
            return parser.parse_yaml_file(yaml_file=argv[0])
        return parser.parse_args_into_dataclasses(args=argv)
    except ValueError as error:  # unknown or invalid arguments: say so in one line, before anything runs
        raise TrainingSetupError(str(error)) from error


def run_with_clear_errors(job: Callable[[], Any]) -> int:
    """Run `job`; a setup error (bad input found before training) is printed as one line and exits with 2, a
    failed push after training (the final folder is written and intact) with 1."""
    from ..hub import HubPushError

    try:
        job()
    except TrainingSetupError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except HubPushError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0
