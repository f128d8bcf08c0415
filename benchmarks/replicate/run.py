"""Entry point: run the comparisons of the plan, cache every run, and write REPORT.md with its figures.

    python -m benchmarks.replicate                  # budget 1: about an hour on two quiet cores
    python -m benchmarks.replicate --budget 0.25    # every training run 4x shorter
    python -m benchmarks.replicate --smoke          # CI: a few steps of every row (report in the work folder)
    python -m benchmarks.replicate --only language,vision --budget 0.25   # some sections; --only report: redraw

Each run's record is written to `<records-dir>/<section>-<settings hash>/` (committed: benchmarks/results/replicate)
as soon as it finishes and reused by later invocations with the same settings, so a killed run resumes, sections can
run in separate invocations, and `--only report` redraws REPORT.md from the committed records alone.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

from .._common import invocation, without_provenance, write_results
from .plan import Plan, make_plan
from .report import render_report, section_invocations

SECTIONS = ("language", "vision", "compute")
REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_DATA = Path(os.environ.get("AOT_SHARED_DATA", REPO_ROOT.parent / "shared" / "data"))
DEFAULT_REPORT_DIR = Path(__file__).resolve().parent
DEFAULT_RECORDS_DIR = REPO_ROOT / "benchmarks" / "results" / "replicate"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.replicate", description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=1.0, help="scales every training run (1 = about an hour)")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes, two steps per row (CI)")
    parser.add_argument("--seeds", type=int, default=2, help="seeds of the main rows (default 2)")
    parser.add_argument(
        "--only", default=",".join(SECTIONS), help=f"comma-separated sections among {', '.join(SECTIONS)}, or 'report'"
    )
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA, help="the shared data folder")
    parser.add_argument(
        "--text", type=Path, help="training text, file or folder (default: <data-dir>/text/janeausten)"
    )
    parser.add_argument("--tokenizer", type=Path, help="tokenizer folder (default: <data-dir>/tokenizer-gpt2)")
    parser.add_argument("--eval-dir", type=Path, help="zero-shot files (default: <data-dir>/eval-dev)")
    parser.add_argument("--cifar", type=Path, help="CIFAR-10 archives (default: <data-dir>/vision/cifar10)")
    parser.add_argument("--work-dir", type=Path, help="Trainer scratch and results.json (default: a temp folder)")
    parser.add_argument(
        "--records-dir", type=Path, help="per-run records (default: benchmarks/results/replicate; smoke: work folder)"
    )
    parser.add_argument("--report-dir", type=Path, help="REPORT.md + PNGs (default: benchmarks/replicate)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    return parser.parse_args(argv)


class RunCache:
    """One JSON record per (section, row, seed) under a folder named by the section's settings, each with the
    provenance of the invocation `command` that wrote it (`write_results`)."""

    def __init__(self, records_dir: Path, work_dir: Path, plan: Plan, section: str, command: str):
        self.folder = records_dir / f"{section}-{plan.section_key(section)}"
        self.scratch = work_dir / self.folder.name / "trainer"  # checkpoints: never committed
        self.command = command

    def path(self, name: str) -> Path:
        return self.folder / f"{name.replace('+', '_')}.json"

    def get(self, name: str) -> dict | None:
        """The record `name` without its provenance, or None when it was not written yet."""
        path = self.path(name)
        return without_provenance(json.loads(path.read_text())) if path.is_file() else None

    def put(self, name: str, record: dict) -> None:
        """Write the record `name` atomically (a kill never leaves half a record)."""
        write_results(self.path(name), record, self.command, indent=1)


def _load() -> str:
    try:
        return f"{os.getloadavg()[0]:.1f}"
    except OSError:  # pragma: no cover - platforms without getloadavg
        return "n/a"


def _runs(rows, seeds):
    return [(row, seed) for row in rows for seed in (seeds if row.main else seeds[:1])]


def _rerun_check(cache: RunCache, runs, records: list[dict], metric: str, train) -> dict:
    """Train the first run of the section a second time from scratch; the report compares the two values.

    This measures reproducibility instead of asserting it: same seed, same data order, fresh model and Trainer.
    """
    check = cache.get("rerun")
    if check is None:
        (row, seed), first = runs[0], records[0]
        start = time.perf_counter()
        second = train(row, seed)
        check = {"run": f"{row.label}, seed {seed}", "metric": metric, "first": first[metric], "rerun": second[metric]}
        cache.put("rerun", check)
        print(
            f"  rerun of {check['run']}: {metric} {check['first']:.6f} then {check['rerun']:.6f} "
            f"({time.perf_counter() - start:.0f} s)",
            flush=True,
        )
    return check


def _step_seconds(cache: RunCache, rows, measure) -> dict:
    """The cached per-step timings, measured again (all rows side by side) when a row has none yet."""
    timing = cache.get("step-seconds")
    if timing is None or {row.name for row in rows} - set(timing["seconds"]):
        timing = {"seconds": measure()}
        cache.put("step-seconds", timing)
    return timing


def run_language(plan: Plan, args: argparse.Namespace, cache: RunCache) -> dict:
    from .language import prepare_language_data, time_language_rows, train_language_row
    from .models import language_rows

    lp = plan.language
    rows = language_rows(lp)
    data = prepare_language_data(lp, args.text, args.tokenizer, args.eval_dir)
    records, runs = [], _runs(rows, plan.seeds)
    for row, seed in runs:
        name = f"{row.name}-seed{seed}"
        record = cache.get(name)
        if record is None:
            start = time.perf_counter()
            record = train_language_row(row, seed, lp, data, cache.scratch)
            cache.put(name, record)
            print(
                f"  language: {name}: val loss {record['eval_loss']:.3f} "
                f"({time.perf_counter() - start:.0f} s, load {_load()})",
                flush=True,
            )
        records.append(record)
    rerun = _rerun_check(
        cache,
        runs,
        records,
        "eval_loss",
        lambda row, seed: train_language_row(row, seed, lp, data, cache.scratch),
    )
    timing = _step_seconds(cache, rows, lambda: time_language_rows(rows, lp, data))
    embedding = len(data.tokenizer) * lp.hidden_size
    return {
        "runs": records,
        "rerun": rerun,
        "step_seconds": timing["seconds"],
        "tokens_per_step": lp.batch_size * lp.block_size,
        "zero_shot_error": data.zero_shot_error,
        "data": {
            "description": f"{data.description} ({args.text})",
            "train_tokens_available": data.train_tokens_available,
            "unigram_loss": data.unigram_loss,
            "validation_tokens": len(data.validation) * lp.block_size,
            "embedding_parameters": embedding,
        },
    }


def run_vision(plan: Plan, args: argparse.Namespace, cache: RunCache) -> dict:
    from .models import vision_rows
    from .vision import prepare_vision_data, time_vision_rows, train_vision_row

    vp = plan.vision
    rows = vision_rows(vp)
    data = prepare_vision_data(vp, args.cifar)
    records, runs = [], _runs(rows, plan.seeds)
    for row, seed in runs:
        name = f"{row.name}-seed{seed}"
        record = cache.get(name)
        if record is None:
            start = time.perf_counter()
            record = train_vision_row(row, seed, vp, data, cache.scratch)
            cache.put(name, record)
            print(
                f"  vision: {name}: val accuracy {100 * record['eval_accuracy']:.1f}% "
                f"({time.perf_counter() - start:.0f} s, load {_load()})",
                flush=True,
            )
        records.append(record)
    rerun = _rerun_check(
        cache,
        runs,
        records,
        "eval_accuracy",
        lambda row, seed: train_vision_row(row, seed, vp, data, cache.scratch),
    )
    timing = _step_seconds(cache, rows, lambda: time_vision_rows(rows, vp, data))
    return {
        "runs": records,
        "rerun": rerun,
        "step_seconds": timing["seconds"],
        "images_per_step": vp.batch_size,
        "data": {
            "description": data.description,
            "train_images": len(data.train),
            "eval_images": len(data.validation),
        },
    }


def run_compute(plan: Plan, args: argparse.Namespace, cache: RunCache) -> dict:
    from .compute import run_compute as measure

    record = cache.get("compute")
    if record is None:
        record = measure(plan.compute)
        cache.put("compute", record)
    return record


RUNNERS = {"language": run_language, "vision": run_vision, "compute": run_compute}


def redraw_committed_report() -> list[Path]:
    """Redraw the committed REPORT.md and its figures from the committed records, with the settings they were made
    with, in a process of its own (the command sets process-wide state); the files drawn. The study calls it with each
    record, since this report states the study's verdicts on KVT's claims."""
    import re
    import subprocess

    committed = DEFAULT_REPORT_DIR / "REPORT.md"
    budget = re.search(r"come from --budget ([\d.]+)", committed.read_text()).group(1)
    with tempfile.TemporaryDirectory() as work:
        command = ["--only", "report", "--budget", budget, "--work-dir", work]
        subprocess.run([sys.executable, "-m", "benchmarks.replicate", *command], cwd=REPO_ROOT, check=True,
                       capture_output=True)  # fmt: skip
    return [committed, *DEFAULT_REPORT_DIR.glob("*.png")]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = sorted(set(only) - set(SECTIONS) - {"report"})
    if unknown:
        print(
            f"--only: unknown section(s) {unknown}; choose among {', '.join(SECTIONS)} or 'report'.", file=sys.stderr
        )
        return 2
    try:
        plan = make_plan(args.budget, args.smoke, args.seeds)
    except ValueError as error:
        print(error, file=sys.stderr)
        return 2
    label = "smoke" if plan.smoke else f"budget-{plan.budget:g}"
    args.work_dir = args.work_dir or Path(tempfile.gettempdir()) / "aot-replicate" / label
    args.report_dir = args.report_dir or (args.work_dir / "report" if plan.smoke else DEFAULT_REPORT_DIR)
    args.records_dir = args.records_dir or (args.work_dir / "records" if plan.smoke else DEFAULT_RECORDS_DIR)
    args.text = args.text or args.data_dir / "text" / "janeausten"
    args.tokenizer = args.tokenizer or args.data_dir / "tokenizer-gpt2"
    args.eval_dir = args.eval_dir or args.data_dir / "eval-dev"
    args.cifar = args.cifar or args.data_dir / "vision" / "cifar10"
    needed = {"language": [args.text, args.tokenizer], "vision": [args.cifar], "compute": []}
    missing = [str(p) for section in only for p in needed.get(section, []) if not p.exists()]
    if missing:
        print(f"Missing data: {', '.join(missing)} (set --data-dir or the per-source flags).", file=sys.stderr)
        return 2

    import torch
    import transformers

    from .._common import machine

    torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()
    logging.getLogger("aot_transformers").setLevel(logging.WARNING)
    try:
        import datasets

        datasets.disable_progress_bars()
        datasets.logging.set_verbosity_error()
    except ImportError:  # pragma: no cover - datasets is a dependency of the training package
        pass

    command = invocation("benchmarks.replicate", argv)
    print(f"{command.strip()}: records {args.records_dir}, work folder {args.work_dir}", flush=True)
    results: dict = {"plan": plan.to_dict(), "sections": {}}
    for section in SECTIONS:
        cache = RunCache(args.records_dir, args.work_dir, plan, section, command)
        earlier = cache.get("section")
        if section in only:
            print(f"[{section}] start (load {_load()})", flush=True)
            start, load = time.perf_counter(), _load()
            summary = RUNNERS[section](plan, args, cache)
            # Every invocation that worked on these settings, so the report's wall-clock is the whole cost
            # even when a run was resumed or finished by a later invocation.
            summary["meta"] = {
                "invocations": (section_invocations(earlier["meta"]) if earlier else [])
                + [
                    {
                        "command": command.strip(),
                        "minutes": (time.perf_counter() - start) / 60,
                        "load": f"{load} -> {_load()}",
                        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="minutes"),
                    }
                ]
            }
            summary["machine"] = machine()
            cache.put("section", summary)
            print(f"[{section}] done in {summary['meta']['invocations'][-1]['minutes']:.1f} min", flush=True)
        elif earlier is not None:
            summary = earlier
        else:
            continue
        results[section] = summary
        results.setdefault("machine", summary.get("machine", machine()))  # the records', not this machine's
        results.setdefault("threads", {})[section] = summary.get("machine", results["machine"])["threads"]
        results["sections"][section] = summary["meta"]
    args.work_dir.mkdir(parents=True, exist_ok=True)
    (args.work_dir / "results.json").write_text(json.dumps(results, indent=1))
    if not results["sections"]:
        print("No section has results yet for these settings: nothing to report.", file=sys.stderr)
        return 1
    if not plan.smoke:  # the study at scale decides KVT's claims (its committed records)
        from ..study.report import knn_claims

        results["at_scale"] = knn_claims()
    path = render_report(results, args.report_dir)
    print(f"Report: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
