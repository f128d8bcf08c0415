"""The zero-shot suite (the AoT paper's Table 3 layout) for several models, with `aot eval`'s library functions.

    python -m benchmarks.eval.suite out/eval_bench/gpt2 out/eval_bench/aot --names "GPT-2 (4 layers)" "AoT-MSSA (24)"

Runs the tasks whose data is found under --data-dir (by default ../shared/data/eval-dev: PTB validation and the
first 100 LAMBADA test passages; WikiText and CBT have no local copy there and are left out unless --data gives
them), writes each model's results.json / results.md under --output-dir, and prints the comparison table, also
saved as benchmarks/eval/results/suite.md and suite.json.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from aot_transformers.evaluation import evaluate_model, markdown_table
from aot_transformers.evaluation import write_results as write_evaluation
from aot_transformers.evaluation.tasks import TASKS, resolve_sources

from .._common import invocation, write_results

ROOT = Path(__file__).resolve().parents[2]
RESULTS = Path(__file__).resolve().parent / "results"


def local_tasks(data_dir: Path, data: dict[str, str]) -> list[str]:
    """The tasks whose data is a local file (no Hub download on an offline machine)."""
    sources = resolve_sources(list(TASKS), data_dir, data)
    return [name for name, task in TASKS.items() if sources[task.dataset].path is not None]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="+", help="model folders")
    parser.add_argument("--names", nargs="+", help="row labels")
    parser.add_argument("--data-dir", type=Path, default=ROOT.parent / "shared" / "data" / "eval-dev")
    parser.add_argument("--data", action="append", default=[], metavar="TASK=PATH")
    parser.add_argument("--output-dir", type=Path, default=ROOT / "out" / "eval_bench" / "suite")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    data = dict(item.split("=", 1) for item in args.data)
    tasks = local_tasks(args.data_dir, data)
    names = args.names or [Path(model).name for model in args.models]
    print(f"tasks with local data: {tasks}")
    reports = []
    for model, name in zip(args.models, names, strict=True):
        report = evaluate_model(model, tasks, data_dir=args.data_dir, data=data, batch_size=args.batch_size)
        write_evaluation(report, args.output_dir / Path(model).name)
        reports.append(report)
        print(f"{name}: " + ", ".join(f"{t}={r.get('loss', r.get('acc')):.4f}" for t, r in report.results.items()))
    table = markdown_table(reports, names=names)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "suite.md").write_text(table)
    models = {name: report.to_dict() for name, report in zip(names, reports, strict=True)}
    write_results(RESULTS / "suite.json", {"models": models}, invocation("benchmarks.eval.suite", argv))
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
