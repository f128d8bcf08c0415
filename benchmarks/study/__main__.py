"""`python -m benchmarks.study`: train every run of the study that has no record yet, then redraw the report.

    nohup python -m benchmarks.study > study.log 2>&1 &   # hours: runs in the background, resumable, records committed
    python -m benchmarks.study --only report               # REPORT.md and its figures from the committed records
    pkill -TERM -f "m benchmarks.study"                    # before a session ends: stop, commit unfinished checkpoints
    nohup python -m benchmarks.study --stop-after 2.5 ...  # the same stop, by itself, 2.5 hours after the start
    python -m benchmarks.study --save-progress             # commit unfinished runs' checkpoints (a study not running)
    python -m benchmarks.study --smoke --work-dir W         # the tests: the same code, tiny shapes, two steps a run

See README.md beside this file for what runs and why.
"""

from __future__ import annotations

import argparse
import fnmatch
import os
import signal
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

from ..replicate.run import redraw_committed_report
from . import plan as study_plan
from .report import summary_block, write_report, write_summary
from .runner import RECORDS, ROOT, Paths, Stopped, commit, execute, save_progress, stop, uncommitted_records

SHARED = Path(os.environ.get("AOT_SHARED_DATA", ROOT.parent / "shared" / "data"))


def train_tokenizer(corpus: Path, folder: Path, vocab_size: int) -> None:
    """The corpus's byte-level BPE (`aot_transformers.training.lm.train_bpe_tokenizer` on its train split)."""
    import datasets

    from aot_transformers.training.lm import train_bpe_tokenizer

    train = datasets.load_dataset(str(corpus), split="train")
    tokenizer = train_bpe_tokenizer((row["text"] for row in train), vocab_size, length=len(train))
    tokenizer.save_pretrained(folder)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.study", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--only", choices=("language", "vision", "report"), help="one part (default: language, vision, then report)"
    )
    parser.add_argument("--runs", help="comma-separated names or patterns (default: every run without a record)")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes, two steps a run (the tests)")
    parser.add_argument("--smoke-steps", type=int, default=2, help="steps a run with --smoke")
    parser.add_argument("--corpus", type=Path, default=SHARED / "text" / "gutenberg", help="a dataset repository")
    parser.add_argument("--eval-dir", type=Path, default=SHARED / "eval-dev", help="PTB and LAMBADA dev files")
    parser.add_argument("--images", type=Path, default=SHARED / "vision" / "cifar10", help="CIFAR-10's archives")
    parser.add_argument(
        "--work-dir", type=Path, default=ROOT / "runs" / "study", help="output folders (not committed)"
    )
    parser.add_argument(
        "--records-dir", type=Path, help="records (default: benchmarks/results/study; smoke: work dir)"
    )
    parser.add_argument("--report-dir", type=Path, help="REPORT.md and figures (default: beside this file)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads, shared by the runs that train at once")
    parser.add_argument("--jobs", type=int, default=1, help="runs that train at once (see jobs.py: is 2 faster?)")
    parser.add_argument("--no-commit", dest="commit", action="store_false", help="write records without committing")
    parser.add_argument("--save-progress", action="store_true", help="commit unfinished runs' newest checkpoints")
    parser.add_argument("--stop-after", type=float, metavar="HOURS", help="stop as a SIGTERM does, this many hours on")
    args = parser.parse_args(argv)
    smoke = {"extra": {"steps": args.smoke_steps}}
    study = replace(study_plan.SMOKE, **smoke) if args.smoke else study_plan.STUDY
    vision = replace(study_plan.VISION_SMOKE, **smoke) if args.smoke else study_plan.VISION
    records = args.records_dir or (args.work_dir / "records" if args.smoke else RECORDS)
    report_dir = args.report_dir or (args.work_dir if args.smoke else Path(__file__).resolve().parent)
    commit_records = args.commit and not args.smoke
    tokenizer = records / "tokenizer"
    paths = Paths(args.corpus, tokenizer, args.eval_dir, args.images, args.work_dir, records)
    sections = ("language", "vision") if args.only is None else (args.only,) if args.only != "report" else ()
    runs = [run for run in study_plan.schedule(study, vision) if run.section in sections or args.save_progress]
    if args.runs:
        patterns = args.runs.split(",")
        runs = [run for run in runs if any(fnmatch.fnmatch(run.name, p) for p in patterns)]

    readme = ROOT / "README.md"

    def redraw() -> list[Path]:  # REPORT.md, its figures, the README's summary and the miniature's report
        report = write_report(study, vision, records, report_dir)
        drawn = [report, *(report.with_name(name) for name in ("compute.png", "curves.png", "vision_curves.png"))]
        if args.smoke:
            return drawn
        write_summary(readme, summary_block(study, vision, records))
        return [*drawn, readme, *redraw_committed_report()]  # the miniature's report states the k-NN verdicts

    def save(runs) -> None:  # the report says where each unfinished run stands: redrawn with their checkpoints
        written = save_progress(runs, paths)
        drawn = redraw() if written else []
        if written and commit_records:
            message = f"study: checkpoints of {len(written)} unfinished run(s), to resume in the next session"
            commit([*written, *drawn], message)
        print("\n".join(map(str, written)) or "no unfinished run has a checkpoint")

    if args.save_progress:
        save(runs)
        return 0
    if commit_records and (left := uncommitted_records(records)):
        commit(left, f"study: {len(left)} record(s) written but not committed by an earlier invocation")
    if "language" in sections and not (tokenizer / "tokenizer.json").is_file():
        train_tokenizer(args.corpus, tokenizer, study.vocab_size)
        if commit_records:
            commit([tokenizer], f"study: the corpus's byte-level BPE ({study.vocab_size} tokens)")

    lock = threading.Lock()  # one run at a time redraws the summary and commits

    def train(run) -> None:
        print(f"study: {run.name} ({run.steps} steps)", flush=True)
        section_plan = study if run.section == "language" else vision
        threads = max(1, args.threads // args.jobs)
        execute(run, paths, section_plan, threads, commit_records, redraw, lock)

    signal.signal(signal.SIGTERM, lambda *_: stop())  # the runs save their step; their checkpoints are committed
    if args.stop_after is not None:  # a daemon: a study that ends first does not wait for it
        deadline = threading.Timer(args.stop_after * 3600, stop)  # at once if <= 0
        deadline.daemon = True
        deadline.start()
    with ThreadPoolExecutor(args.jobs) as pool:  # in plan order; the first failure stops what has not started
        futures = [pool.submit(train, run) for run in runs]
        for future in futures:
            if future.exception() is not None and not isinstance(future.exception(), Stopped):
                pool.shutdown(cancel_futures=True)
                raise future.exception()
    if any(isinstance(future.exception(), Stopped) for future in futures):
        save(runs)
        print("study: stopped by SIGTERM or --stop-after; the same command resumes", flush=True)
        return 130
    drawn = redraw()
    if commit_records and args.only in (None, "report"):
        commit(drawn, "study: report and README summary redrawn from the records")
    print(f"study: report {drawn[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
