"""`aot eval …`: the zero-shot suite from the command line (thin: parses arguments, calls the library).

aot eval lm MODEL --tasks wikitext,ptb,lambada,lambada_acc,cbt_cn,cbt_ne [--data-dir DIR] [--update-card]
aot eval tasks                       # the tasks, their metrics and default sources
aot eval lm-eval-path                # the folder to pass to `lm_eval --include_path`
aot eval table A/results.json B/results.json --names A B   # one markdown table for several models
"""

from __future__ import annotations

import argparse
import re
import sys
import traceback
from pathlib import Path

from .data import EvaluationError, EvaluationFailed


def _data_overrides(values: list[str]) -> dict[str, str]:
    overrides = {}
    for value in values:
        task, sep, spec = value.partition("=")
        if not sep or not task or not spec:
            raise EvaluationError(f"--data expects TASK=PATH or TASK=hub:REPO_ID[:CONFIG[:SPLIT]], got {value!r}.")
        overrides[task.strip()] = spec.strip()
    return overrides


def _default_output_dir(model: str) -> Path:
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", Path(model.rstrip("/")).name or model) or "model"
    return Path("eval_results") / name


def _card_target(args: argparse.Namespace) -> Path | None:
    if args.update_card is None:
        return None
    if args.update_card:
        return Path(args.update_card)
    model = Path(args.model).expanduser()
    if not model.is_dir():
        raise EvaluationError(
            f"--update-card without a path writes MODEL/README.md, but {args.model} is not a local folder: "
            "give the card's path (--update-card path/to/README.md)."
        )
    return model / "README.md"


def run_lm(args: argparse.Namespace) -> int:
    """`aot eval lm`: evaluate, write results.json / results.md, optionally update the model card."""
    from .model_card import update_model_card
    from .results import write_results
    from .runner import evaluate_model

    card = _card_target(args)
    report = evaluate_model(
        args.model,
        args.tasks,
        tokenizer=args.tokenizer,
        data_dir=args.data_dir,
        data=_data_overrides(args.data),
        max_length=args.max_length,
        stride=args.stride,
        batch_size=args.batch_size,
        bf16=args.bf16,
        device=args.device,
        limit=args.limit,
        progress=not args.no_progress,
    )
    json_path, markdown_path = write_results(report, args.output_dir or _default_output_dir(args.model))
    print(markdown_path.read_text(encoding="utf-8"))
    print(f"wrote {json_path} and {markdown_path}")
    if card is not None:
        print(f"updated the model card {update_model_card(card, report)}")
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


def run_lm_eval_path(args: argparse.Namespace) -> int:
    """`aot eval lm-eval-path`: print the lm-evaluation-harness task folder."""
    from . import lm_eval_tasks_path

    print(lm_eval_tasks_path())
    return 0


def run_table(args: argparse.Namespace) -> int:
    """`aot eval table`: one markdown table (Table 3 layout) for several results files."""
    from .results import markdown_table, read_results

    reports = [read_results(path) for path in args.results]
    if args.names and len(args.names) != len(reports):
        raise EvaluationError(f"--names has {len(args.names)} names for {len(reports)} results files.")
    print(markdown_table(reports, names=args.names or None), end="")
    return 0


def _guard(function):
    """Report user errors as one line and exit code 2; a task that crashes while scoring prints its traceback, the
    task and what is unchanged on disk, and exits with 1; other bugs keep their traceback."""

    def run(args: argparse.Namespace) -> int:
        try:
            return function(args)
        except EvaluationError as error:
            print(f"aot eval: error: {error}", file=sys.stderr)
            return 2
        except EvaluationFailed as failure:
            traceback.print_exception(failure.__cause__ or failure, file=sys.stderr)
            print(
                f"aot eval: error: {failure}. Nothing was written: earlier results files and the model card are "
                "unchanged.",
                file=sys.stderr,
            )
            return 1

    return run


def register(subcommands: argparse._SubParsersAction) -> None:
    """Add `eval` (with `lm`, `tasks`, `lm-eval-path`, `table`) to the `aot` parser's subcommands."""
    from .tasks import TASKS

    evaluation = subcommands.add_parser("eval", help="zero-shot evaluation of language models")
    commands = evaluation.add_subparsers(dest="eval_command", required=True)

    lm = commands.add_parser(
        "lm",
        help="the paper's zero-shot suite on any causal LM",
        description="Zero-shot suite of the AoT paper on a causal LM (a folder or Hub id, loaded with "
        "trust_remote_code=True). Writes results.json and results.md.",
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
    lm.set_defaults(func=_guard(run_lm))

    commands.add_parser("tasks", help="list the tasks and their data sources").set_defaults(func=_guard(run_tasks))
    commands.add_parser(
        "lm-eval-path", help="print the lm-evaluation-harness task folder (for --include_path)"
    ).set_defaults(func=_guard(run_lm_eval_path))

    table = commands.add_parser("table", help="markdown table of several results.json files")
    table.add_argument("results", nargs="+", help="results.json files")
    table.add_argument("--names", nargs="+", help="row labels, one per file")
    table.set_defaults(func=_guard(run_table))


__all__ = ["register"]
