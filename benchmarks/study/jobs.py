"""Do two study runs at once, one torch thread each, train more per hour than one run with both threads?

    python -m benchmarks.study.jobs      # about thirteen minutes, on a quiet machine (the study stopped)

For a few rows of the plan (S's GPT-2 and AoT-MSSA, the vision study's ViT and AoT-MSSA), the study's own `aot
train` command, cut to `--steps` steps with no evaluation along the way and no checkpoints, trains once alone with
two threads, then twice at the same time with one thread each. Trainer's `train_runtime` of each is compared
(start-up and the final evaluation excluded): `pair_speedup` is the work of two runs over the wall time of the pair,
against one run's, i.e. how much faster the study goes with `--jobs 2`. The language rows train on Tiny Shakespeare
with the study's tokenizer (the same shapes; no 200 MB to prepare), the vision rows on CIFAR-10's archives.
Writes results/study_jobs.json, keeping the rows probed before (each with its own date): `--runs L-gpt2-seed0,...`
probes the larger sizes' rows beside the earlier ones.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

from .._common import RESULTS_DIR as RESULTS
from .._common import write_results
from . import plan as study_plan
from .runner import RECORDS, ROOT, Paths, aot_process, command

SHARED = Path(os.environ.get("AOT_SHARED_DATA", ROOT.parent / "shared" / "data"))
PROBED = ("S-gpt2-seed0", "S-aot-mssa-seed0", "cifar10-vit-seed0", "cifar10-aot-mssa-seed0")
CUT = {"--eval_strategy": "no", "--save_strategy": "no", "--max_eval_samples": "64", "--make_plots": "false"}


def _arguments(run: study_plan.Run, paths: Paths, steps: int, output: Path) -> list[str]:
    """The study's command for `run`, cut to `steps` steps, no evaluation along the way, no checkpoints."""
    arguments = command(run, paths, study_plan.STUDY if run.section == "language" else study_plan.VISION)
    options = {**CUT, "--max_steps": str(steps), "--output_dir": str(output)}
    for flag in (*options, "--eval_steps", "--save_steps", "--save_total_limit", "--resume_from_checkpoint"):
        if flag in arguments:
            at = arguments.index(flag)
            del arguments[at : at + 2]
    return [*arguments, *(item for pair in options.items() for item in pair)]


def _start(arguments: list[str], threads: int) -> subprocess.Popen:
    env, program = aot_process(arguments, threads)  # as the study starts a run
    return subprocess.Popen(program, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _train_seconds(processes: list[tuple[subprocess.Popen, Path]]) -> list[float]:
    seconds = []
    for process, output in processes:
        _, stderr = process.communicate()
        if process.returncode != 0:
            raise RuntimeError(f"aot train failed (exit {process.returncode}): {stderr[-2000:]}")
        seconds.append(json.loads((output / "all_results.json").read_text())["train_runtime"])
    return seconds


def probe(run: study_plan.Run, paths: Paths, steps: int, work: Path) -> dict:
    """One run alone with two threads, then two copies at once with one thread each."""
    alone = work / f"{run.name}-alone"
    (one,) = _train_seconds([(_start(_arguments(run, paths, steps, alone), 2), alone)])
    pair = [work / f"{run.name}-pair{i}" for i in range(2)]
    started = time.perf_counter()
    both = _train_seconds([(_start(_arguments(run, paths, steps, out), 1), out) for out in pair])
    return {
        "steps": steps,
        "alone_2_threads_seconds": one,
        "pair_1_thread_each_seconds": both,
        "pair_wall_seconds": time.perf_counter() - started,
        "pair_speedup": 2 * one / max(both),
    }


def merged(before: dict, probes: dict, now: dict) -> dict:
    """The probes of the results file `before` (each dated by it unless it carries its own date) with `probes`, just
    measured (dated `now`), in their place where they probe the same row."""
    earlier = {
        name: {"measured": {"date": before.get("date")}, **found} for name, found in before.get("probes", {}).items()
    }
    return {**earlier, **{name: {**found, "measured": now} for name, found in probes.items()}}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.study.jobs", description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=30, help="training steps of each probe run")
    parser.add_argument("--runs", default=",".join(PROBED), help="the study runs to probe")
    args = parser.parse_args(argv)
    text = SHARED / "text" / "tinyshakespeare" / "input.txt"
    runs = {run.name: run for run in study_plan.schedule(study_plan.STUDY, study_plan.VISION)}
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as work:
        paths = Paths(
            text, RECORDS / "tokenizer", SHARED / "eval-dev", SHARED / "vision" / "cifar10", Path(work), Path(work)
        )
        probes = {name: probe(runs[name], paths, args.steps, Path(work)) for name in args.runs.split(",")}
    previous = RESULTS / "study_jobs.json"
    now = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "load_before": load_before}
    results = {
        "question": "train two study runs at once with one thread each (--jobs 2), or one with two threads?",
        "load_average_before_and_after": [load_before, os.getloadavg()],
        "probes": merged(json.loads(previous.read_text()) if previous.is_file() else {}, probes, now),
    }
    print(json.dumps(probes, indent=1))
    write_results("study_jobs", results)
    return results


if __name__ == "__main__":
    main()
