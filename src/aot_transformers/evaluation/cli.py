"""`aot eval …`: the zero-shot suite from the command line (thin: parses arguments, calls the library).

aot eval lm MODEL --tasks wikitext,ptb,lambada,lambada_acc,cbt_cn,cbt_ne [--data-dir DIR] [--update-card]
aot eval tasks                       # the tasks, their metrics and default sources
aot eval lm-eval-path                # the folder to pass to `lm_eval --include_path`
aot eval table A/results.json B/results.json --names A B   # one markdown table for several models
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from .._io import LOCK_FILE, FolderLockedError, lock_folder
from ..errors import RunError, run_command
from .data import EvaluationError

if TYPE_CHECKING:
    from filelock import BaseFileLock


def _data_overrides(values: list[str]) -> dict[str, str]:
    overrides = {}
    for value in values:
        task, sep, spec = value.partition("=")
        if not sep or not task or not spec:
            raise EvaluationError(f"--data expects TASK=PATH or TASK=hub:REPO_ID[:CONFIG[:SPLIT]], got {value!r}.")
        overrides[task.strip()] = spec.strip()
    return overrides


def _card_target(args: argparse.Namespace) -> Path | None:
    """The card file `--update-card` writes (checked before any evaluation: its folder exists, it can be read)."""
    from ..model_card import card_file, load_card

    if args.update_card is None:
        return None
    if args.update_card:
        card = card_file(args.update_card)
    else:
        model = Path(args.model).expanduser()
        if not model.is_dir():
            raise EvaluationError(
                f"--update-card without a path writes MODEL/README.md, but {args.model} is not a local folder: "
                "give the card's path (--update-card path/to/README.md)."
            )
        card = model / "README.md"
    if not card.parent.is_dir():
        raise EvaluationError("its folder does not exist", argument="--update-card", value=str(card))
    hub_results = card.parent / ".eval_results"
    if card.name == "README.md" and hub_results.exists() and not hub_results.is_dir():
        raise EvaluationError(f"{hub_results} is a file, but the Hub's evaluation results folder must be a folder.")
    if card.exists():
        if not card.is_file():
            raise EvaluationError("not a file", argument="--update-card", value=str(card))
        load_card(card)  # a malformed card fails now, not after the evaluation
    return card


def _check_output_dir(folder: Path) -> None:
    """A clear error now, rather than after the evaluation, when results cannot be written into `folder`."""
    if folder.exists() and not folder.is_dir():
        raise EvaluationError("exists and is not a folder", argument="--output-dir", value=str(folder))
    existing = folder.absolute()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise EvaluationError(
            f"{existing} is a file, so the folder cannot be created", argument="--output-dir", value=str(folder)
        )
    if not os.access(existing, os.W_OK | os.X_OK):
        raise EvaluationError(f"{existing} is not writable", argument="--output-dir", value=str(folder))


def _lock(folder: Path) -> BaseFileLock:
    """Hold `.<folder>.aot.lock` beside the card's folder (never inside it, where a plain upload would publish it), so
    that a second run updating the same card fails at once instead of silently losing one of the two results."""
    try:
        return lock_folder(folder.parent / f".{folder.name}{LOCK_FILE}")
    except FolderLockedError as error:
        if error.cause is not None:
            raise EvaluationError(f"{error}: the model card's folder is not writable.") from None
        raise EvaluationError(
            f"{error}: wait for it to finish, or update another card (two runs updating one model card would lose "
            "one's results)."
        ) from None


def run_lm(args: argparse.Namespace) -> int:
    """`aot eval lm`: evaluate, write results.json / results.md, optionally update the model card.

    Every argument is checked before the model runs (device, output folder, card, lock on the card's folder); the
    files are written only once every task has finished with finite numbers.
    """
    from .results import update_model_card, write_results
    from .runner import check_device, evaluate_model

    check_device(args.device)
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", Path(args.model.rstrip("/")).name or args.model) or "model"
    output_dir = Path(args.output_dir) if args.output_dir else Path("eval_results") / name
    _check_output_dir(output_dir)
    card = _card_target(args)
    lock = _lock(card.parent) if card is not None else None
    try:
        # The options named as `evaluate_model`'s keywords, then the two that are converted.
        names = "tokenizer data_dir max_length stride batch_size bf16 device limit trust_remote_code".split()
        options = {name: getattr(args, name) for name in names}
        options.update(data=_data_overrides(args.data), progress=not args.no_progress)
        report = evaluate_model(args.model, args.tasks, **options)
        try:  # a NaN metric: NonFiniteMetricError (exit 1 naming the metrics), nothing written
            json_path, markdown_path = write_results(report, output_dir)
        except OSError as error:
            raise RunError(
                f"could not write the results into {output_dir} ({type(error).__name__}: {error}); earlier results "
                "files there are unchanged."
            ) from error
        print(markdown_path.read_text(encoding="utf-8"))
        print(f"wrote {json_path} and {markdown_path}")
        if card is not None:
            try:
                written = update_model_card(card, report)
            except OSError as error:
                raise RunError(
                    f"could not update the model card {card} ({type(error).__name__}: {error}); the results are in "
                    f"{json_path}: run again with --update-card once the cause is fixed."
                ) from error
            print(f"updated the model card {written}")
    finally:
        if lock is not None:
            lock.release()
    return 0


def run_tasks(args: argparse.Namespace) -> int:
    """`aot eval tasks`: list the tasks."""
    from .tasks import DATASETS, TASKS

    for task in TASKS.values():
        dataset = DATASETS[task.dataset]
        print(f"{task.name:12s} {task.description}")
        print(f"{'':12s}   hub: {dataset.hub.describe()}   files: {', '.join(dataset.file_names)}")
        print(f"{'':12s}   lm-eval: {task.lm_eval_task}")
    return 0


def run_table(args: argparse.Namespace) -> int:
    """`aot eval table`: one markdown table (Table 3 layout) for several results files."""
    from .results import markdown_table, read_results

    reports = [read_results(path) for path in args.results]
    if args.names and len(args.names) != len(reports):
        raise EvaluationError(f"--names has {len(args.names)} names for {len(reports)} results files.")
    print(markdown_table(reports, names=args.names or None), end="")
    return 0


def _guard(function: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Run an `aot eval` command under the error contract of `aot_transformers.errors`, as `aot eval`."""
    return lambda args: run_command(lambda: function(args), prog="aot eval")


def register(subcommands: argparse._SubParsersAction) -> None:
    """Add `eval` (with `lm`, `tasks`, `lm-eval-path`, `table`) to the `aot` parser's subcommands."""
    from . import lm_eval_tasks_path
    from .tasks import TASKS

    evaluation = subcommands.add_parser("eval", help="zero-shot evaluation of language models")
    commands = evaluation.add_subparsers(dest="eval_command", required=True)

    lm = commands.add_parser(
        "lm",
        help="the paper's zero-shot suite on any causal LM",
        description="Zero-shot suite of the AoT paper on a causal LM (a folder or Hub id). A model's own code runs "
        "only for a local AoT folder that `aot verify` passes, or with --trust-remote-code. Writes results.json and "
        "results.md.",
    )
    lm.add_argument("model", help="model folder or Hub id")
    lm.add_argument("--tasks", default="all", help=f"comma-separated, from: {', '.join(TASKS)} (default: all)")
    lm.add_argument(
        "--data-dir",
        help="folder searched recursively for the published files (wiki.test.raw, "
        "ptb.test.txt, lambada_test.jsonl, cbtest_CN_test_2500ex.txt, ...)",
    )
    lm.add_argument(
        "--data",
        action="append",
        default=[],
        metavar="TASK=SOURCE",
        help="source of one task's data: a file, or hub:REPO_ID[:CONFIG[:SPLIT]] (repeatable)",
    )
    lm.add_argument("--tokenizer", help="tokenizer folder or Hub id when it is not saved with the model")
    lm.add_argument("--max-length", type=int, help="context window (default: the model's)")
    lm.add_argument("--stride", type=int, help="new tokens per sliding window (default: max length)")
    lm.add_argument("--batch-size", type=int, default=8, help="windows per forward pass (default: 8)")
    lm.add_argument("--bf16", action="store_true", help="bfloat16 autocast")
    lm.add_argument("--device", help="cpu, cuda, cuda:1, ... (default: cuda if available)")
    lm.add_argument("--limit", type=int, help="only the first N documents / examples of each dataset")
    lm.add_argument("--output-dir", help="where results.json and results.md go (default: eval_results/MODEL_NAME)")
    lm.add_argument(
        "--update-card",
        nargs="?",
        const="",
        metavar="CARD",
        help="write the results into a model card's model-index (default card: MODEL/README.md)",
    )
    lm.add_argument("--no-progress", action="store_true", help="no progress bars")
    lm.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="run the model's own code even when `aot verify` does not pass it (needed for a Hub id or folder with "
        "code of its own; a local AoT folder that verifies is trusted without it)",
    )
    lm.set_defaults(func=_guard(run_lm))

    commands.add_parser("tasks", help="list the tasks and their data sources").set_defaults(func=_guard(run_tasks))
    commands.add_parser(
        "lm-eval-path", help="print the lm-evaluation-harness task folder (for --include_path)"
    ).set_defaults(func=_guard(lambda args: print(lm_eval_tasks_path())))

    table = commands.add_parser("table", help="markdown table of several results.json files")
    table.add_argument("results", nargs="+", help="results.json files")
    table.add_argument("--names", nargs="+", help="row labels, one per file")
    table.set_defaults(func=_guard(run_table))
