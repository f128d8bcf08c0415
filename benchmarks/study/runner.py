"""Run one study run with `aot train`, as a user would, and turn what it wrote into the run's record.

A run trains in its own process (`aot train lm ... --resume_from_checkpoint auto --enable_jit_checkpoint`), so a
killed run continues from its last checkpoint (about every `plan.CHECKPOINT_STEPS` steps) the next time, and one
stopped by SIGTERM (`stop`) from the step it was in; a run whose record exists is skipped. Between sessions,
`save_progress` copies the newest checkpoint of each unfinished run next to the records (committed) and
`restore_progress` puts it back.
The record holds the curves, final metrics, tokens, FLOPs, wall time and the provenance every results file records
(command, git revision, library versions, host, with the host's load while the run trained); it is written atomically
and committed the moment the run ends.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shlex
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from .._common import provenance
from . import plan as study_plan
from .flops import image_training_flops, training_flops_per_token

ROOT = Path(__file__).resolve().parents[2]
RECORDS = ROOT / "benchmarks" / "results" / "study"
PROGRESS = "progress"  # <records>/progress/<run>/: the newest checkpoint of an unfinished run, between sessions
CHECKPOINT_FILES = (  # what Trainer needs to resume exactly (weights, optimizer, schedule, RNG, data position)
    "model.safetensors config.json generation_config.json optimizer.pt scheduler.pt rng_state.pth "
    "trainer_state.json training_args.bin aot_run.json"
).split()  # (and the run's `study_wall.json`, from its output folder)


@dataclass(frozen=True)
class Paths:
    """Where a study reads and writes."""

    corpus: Path  # the Gutenberg dataset repository (or any dataset with train/validation/test splits)
    tokenizer: Path
    eval_dir: Path  # holds ptb/ptb.valid.txt and lambada/lambada_dev100.jsonl
    images: Path  # CIFAR-10's train_<class>.tar.gz archives
    work: Path  # runs' output folders (checkpoints, final models): not committed
    records: Path  # one JSON record per finished run: committed


def command(run: study_plan.Run, paths: Paths, study) -> list[str]:
    """The `aot train` arguments of `run` (without the program name)."""
    if run.section == "vision":
        return image_command(run, paths, study)
    steps = run.steps
    every = max(1, steps // study.evaluations)
    save = checkpoint_steps(every)
    return [
        "train",
        "lm",
        *run.arguments,
        "--dataset_name", str(paths.corpus),
        "--tokenizer_name_or_path", str(paths.tokenizer),
        "--preprocessing_num_workers", "2",
        "--block_size", str(study.block_size),
        "--per_device_train_batch_size", str(study.batch_size),
        "--per_device_eval_batch_size", "32",
        "--max_steps", str(steps),
        "--learning_rate", str(study.learning_rate),
        "--lr_scheduler_type", "cosine",
        "--warmup_steps", str(max(1, round(study.warmup * steps))),
        "--weight_decay", "0.1",
        "--adam_beta2", "0.95",
        "--max_grad_norm", "1.0",
        "--eval_strategy", "steps",
        "--eval_steps", str(every),
        "--max_eval_samples", str(study.eval_blocks),
        "--logging_steps", str(max(1, every // 5)),
        "--save_strategy", "steps",
        "--save_steps", str(save),
        "--save_total_limit", "1",
        "--seed", str(run.seed),
        "--output_dir", str(paths.work / run.name),
        "--resume_from_checkpoint", "auto",
        "--enable_jit_checkpoint",
        "--report_to", "none",
        "--use_cpu",
        "--disable_tqdm", "true",
        "--make_plots", "false",
    ]  # fmt: skip


def checkpoint_steps(every: int) -> int:
    """Steps between checkpoints: `every` (the steps between evaluations) cut into equal parts of about
    `plan.CHECKPOINT_STEPS`, so a kill costs minutes at every size and checkpoints still fall on evaluations."""
    return every // max(1, round(every / study_plan.CHECKPOINT_STEPS))


def image_command(run: study_plan.Run, paths: Paths, study: study_plan.VisionStudy) -> list[str]:
    """The `aot train image` arguments of a vision run: evaluated ten times along the run."""
    every = max(1, run.steps // 10)
    extra = ["--max_train_samples", "16", "--max_eval_samples", "8"] if study.extra else []
    return [
        "train", "image", *run.arguments,
        "--dataset_name", str(paths.images), "--rand_augment", *extra,
        "--rand_augment_magnitude", str(study.rand_augment_magnitude),
        "--per_device_train_batch_size", str(study.batch_size), "--per_device_eval_batch_size", "256",
        "--max_steps", str(run.steps), "--learning_rate", str(study.learning_rate),
        "--lr_scheduler_type", "cosine", "--warmup_steps", str(max(1, round(study.warmup * run.steps))),
        "--weight_decay", str(study.weight_decay), "--max_grad_norm", "1.0",
        "--eval_strategy", "steps", "--eval_steps", str(every), "--logging_steps", str(max(1, every // 5)),
        "--save_strategy", "steps", "--save_steps", str(checkpoint_steps(every)), "--save_total_limit", "1",
        "--seed", str(run.seed), "--output_dir", str(paths.work / run.name), "--resume_from_checkpoint", "auto",
        "--enable_jit_checkpoint",
        "--report_to", "none", "--use_cpu", "--disable_tqdm", "true", "--make_plots", "false",
    ]  # fmt: skip


def zero_shot_command(model_dir: Path, paths: Paths, output: Path) -> list[str]:
    """The `aot eval lm` arguments scoring PTB and LAMBADA (loss and last-word accuracy) from the local dev files."""
    ptb, lambada = paths.eval_dir / "ptb" / "ptb.valid.txt", paths.eval_dir / "lambada" / "lambada_dev100.jsonl"
    return [
        "eval", "lm", str(model_dir),
        "--tasks", "ptb,lambada,lambada_acc",
        "--data", f"ptb={ptb}", "--data", f"lambada={lambada}", "--data", f"lambada_acc={lambada}",
        "--output-dir", str(output), "--no-progress",
    ]  # fmt: skip


WALL_FILE = "study_wall.json"  # a run's wall-clock seconds over every invocation, kept in its output folder


class LoadSampler:
    """The host's 1-minute load average, sampled every `interval` seconds while a run trains, and the run's wall-clock
    time over all its invocations (`<output>/study_wall.json`, updated at each sample: a killed one keeps its time)."""

    def __init__(self, output: Path, interval: float = 60.0):
        self.samples: list[float] = []
        self.file = output / WALL_FILE
        self.before = json.loads(self.file.read_text())["seconds"] if self.file.is_file() else 0.0
        self.start = time.time()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, args=(interval,), daemon=True)

    @property
    def wall(self) -> float:
        return self.before + time.time() - self.start

    def _sample(self, interval: float) -> None:
        while not self._stop.is_set():
            self.samples.append(os.getloadavg()[0])
            self.file.write_text(json.dumps({"seconds": self.wall}))
            self._stop.wait(interval)

    def __enter__(self) -> LoadSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.file.write_text(json.dumps({"seconds": self.wall}))

    def summary(self) -> dict[str, float]:
        values = self.samples or [os.getloadavg()[0]]
        return {"mean": sum(values) / len(values), "max": max(values), "samples": len(values)}


def aot_process(arguments: list[str], threads: int) -> tuple[dict[str, str], list[str]]:
    """The environment (`threads` torch threads) and program line of `aot <arguments>` in a process of its own."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "true"}
    return env, [sys.executable, "-m", "aot_transformers.cli", *arguments]


STOPPING = threading.Event()  # set by `stop`: no run starts, the ones training save their step and end
_RUNNING: set[subprocess.Popen] = set()


class Stopped(RuntimeError):
    """A run ended by `stop` (SIGTERM) before its end: its newest checkpoint holds the step it was in."""


def stop() -> None:
    """End the study gracefully: start no other run and pass SIGTERM to the `aot` processes running, which save the
    step under way (`--enable_jit_checkpoint`) and exit."""
    STOPPING.set()
    for process in list(_RUNNING):
        process.terminate()


def _aot(arguments: list[str], threads: int, log: Path) -> None:
    """Run `aot <arguments>` at low priority with `threads` torch threads, its output appended to `log`."""
    env, program = aot_process(arguments, threads)
    with open(log, "a", encoding="utf-8") as handle:
        handle.write(f"\n$ aot {shlex.join(arguments)}\n")
        handle.flush()
        process = subprocess.Popen(["nice", "-n", "10", *program], env=env, stdout=handle, stderr=subprocess.STDOUT)
        _RUNNING.add(process)
        if STOPPING.is_set():  # stopping already (or since `stop` looked at the running processes)
            process.terminate()
        try:
            returncode = process.wait()
        finally:
            _RUNNING.discard(process)
    if returncode != 0:
        error = Stopped if STOPPING.is_set() else RuntimeError
        raise error(f"`aot {' '.join(arguments[:2])}` failed (exit {returncode}); see {log}")


def parameter_counts(model_dir: Path, section: str = "language") -> dict[str, int]:
    """Total and non-embedding parameters of a saved model, built on the meta device. Non-embedding: a language
    model's weights but its token and position tables (and the tied output projection); an image classifier's
    transformer layers (its patch and position embeddings, class token and head aside)."""
    import re

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageClassification

    import aot_transformers  # noqa: F401  (registers AoT with the Auto classes)

    auto = AutoModelForCausalLM if section == "language" else AutoModelForImageClassification
    with torch.device("meta"):
        model = auto.from_config(AutoConfig.from_pretrained(model_dir))
    total = sum(p.numel() for p in model.parameters())
    if section != "language":
        layers = sum(p.numel() for n, p in model.named_parameters() if re.search(r"\.layers?\.\d+\.", n))
        return {"total": total, "non_embedding": layers}
    embeddings = {id(p) for m in model.modules() if isinstance(m, torch.nn.Embedding) for p in m.parameters()}
    embeddings |= {id(p) for p in model.get_output_embeddings().parameters()}
    return {"total": total, "non_embedding": sum(p.numel() for p in model.parameters() if id(p) not in embeddings)}


def build_record(
    run: study_plan.Run, paths: Paths, study, arguments: list[str], wall: float, load: dict, threads: int
) -> dict:
    """The record of a finished run, from the files `aot train` (and, for language, `aot eval`) wrote, with its
    provenance (`benchmarks._common.provenance`); the host's threads are the run's (`threads`), with its load."""
    from transformers import AutoConfig

    import aot_transformers  # noqa: F401  (registers AoT with the Auto classes)

    output = paths.work / run.name
    model_dir = output / "model"
    metrics = json.loads((model_dir / "results.json").read_text())["metrics"]
    history = json.loads((output / "trainer_state.json").read_text())["log_history"]
    losses = [[e["step"], e["loss"]] for e in history if "loss" in e]
    config = AutoConfig.from_pretrained(model_dir)  # standard names whatever the model (GPT-2's n_layer, n_embd)
    if run.section == "language":
        per_example = training_flops_per_token(model_dir, study.block_size)
        unigram = math.log(metrics["eval_unigram_perplexity"])
        metric = "eval_loss"
        final = {
            "eval_loss": metrics["eval_loss"],
            "test_loss": metrics.get("test_loss"),
            "unigram_loss": unigram,
            "below_unigram": unigram - metrics["eval_loss"],
            "train_loss": losses[-1][1] if losses else None,  # the last logged (a resumed run's too)
        }
        zero_shot = json.loads((output / "zero-shot" / "results.json").read_text())
        extra = {"zero_shot": zero_shot.get("results", zero_shot)}
    else:
        per_example = image_training_flops(model_dir, (config.image_size // config.patch_size) ** 2)
        metric = "eval_accuracy"
        final = {"eval_accuracy": metrics["eval_accuracy"], "eval_loss": metrics["eval_loss"]}
        final["train_loss"] = losses[-1][1] if losses else None
        extra = {}
    record = {
        "run": run.name,
        "section": run.section,
        "arch": run.arch,
        "size": run.size,
        "seed": run.seed,
        "main": run.main,
        "model_type": config.model_type,
        "shape": {k: getattr(config, k) for k in ("num_hidden_layers", "hidden_size", "num_attention_heads")},
        "parameters": parameter_counts(model_dir, run.section),
        "tokens": run.tokens,  # training tokens (language) or images (vision)
        "steps": run.steps,
        "flops": per_example * run.tokens,
        "flops_per_token": per_example,
        "curves": {"train": losses, "eval": [[e["step"], e[metric]] for e in history if metric in e]},
        "final": final,
        **extra,
        "wall_seconds": wall,  # over every invocation of the run (a resumed one included)
        "train_seconds": metrics.get("train_runtime"),  # Trainer's: the last invocation's alone, for a resumed run
        **provenance("aot " + shlex.join(arguments)),  # command, git revision, versions, host, date
    }
    record["host"] |= {"threads": threads, "load_1min": load}  # the run's OMP_NUM_THREADS, not this process's
    return record


def record_path(run: study_plan.Run, records: Path) -> Path:
    return records / run.section / f"{run.name}.json"


def restore_progress(run: study_plan.Run, paths: Paths) -> None:
    """Put a run's committed checkpoint back into its output folder when the folder has none (a new machine)."""
    saved = paths.records / PROGRESS / run.name
    output = paths.work / run.name
    if not saved.is_dir() or any(output.glob("checkpoint-*")):
        return
    state = json.loads((saved / "trainer_state.json").read_text())
    target = output / f"checkpoint-{state['global_step']}"
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(saved, target)
    shutil.copy2(saved / "aot_run.json", output / "aot_run.json")
    if (saved / WALL_FILE).is_file():
        shutil.move(target / WALL_FILE, output / WALL_FILE)


def save_progress(runs: list[study_plan.Run], paths: Paths) -> list[Path]:
    """Copy the newest complete checkpoint of every started, unfinished run to `<records>/progress/<run>/`, so that
    the next session (a new machine) resumes it; returns the folders written."""
    from aot_transformers.training.run_state import last_complete_checkpoint

    written = []
    for run in runs:
        if record_path(run, paths.records).is_file():
            continue
        checkpoint = last_complete_checkpoint(paths.work / run.name)
        if checkpoint is None:
            continue
        target = paths.records / PROGRESS / run.name
        staging = target.with_name(target.name + ".tmp")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        for name in CHECKPOINT_FILES:
            if (Path(checkpoint) / name).is_file():
                shutil.copy2(Path(checkpoint) / name, staging / name)
        if (paths.work / run.name / WALL_FILE).is_file():
            shutil.copy2(paths.work / run.name / WALL_FILE, staging / WALL_FILE)
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)
        written.append(target)
    return written


def uncommitted_records(records: Path) -> list[Path]:
    """Records written but never committed (a study stopped between writing a record and committing it)."""
    if not records.is_dir():
        return []
    listed = subprocess.run(
        ["git", "ls-files", "--others", "--modified", "--exclude-standard", "--", "language", "vision"],
        cwd=records, capture_output=True, text=True,
    ).stdout.split()  # fmt: skip
    return [records / name for name in listed if name.endswith(".json")]


def commit(paths: list[Path], message: str) -> None:
    """`git add` and commit exactly `paths` (other staged changes stay staged), retrying while another git command
    holds the index lock."""

    def tracked(path: Path) -> bool:
        return bool(subprocess.run(["git", "ls-files", "--", str(path)], cwd=ROOT, capture_output=True).stdout)

    paths = [str(p) for p in paths if Path(p).exists() or tracked(Path(p))]  # a deleted progress folder too
    for attempt in range(30):
        added = subprocess.run(["git", "add", "-A", "--", *paths], cwd=ROOT, capture_output=True, text=True)
        done = subprocess.run(
            ["git", "commit", "-q", "-m", message, "--", *paths], cwd=ROOT, capture_output=True, text=True
        )
        if added.returncode == 0 and done.returncode == 0:
            return
        if "nothing to commit" in done.stdout + done.stderr:  # a redraw that changed nothing
            return
        if "index.lock" not in added.stderr + done.stderr:
            print(f"study: commit of {paths} failed: {done.stderr.strip() or added.stderr.strip()}", file=sys.stderr)
            return
        time.sleep(2 + attempt)


def execute(run: study_plan.Run, paths: Paths, study, threads: int, commit_records: bool, redraw=None, lock=None):
    """Train (or resume) `run`, score it zero-shot, write its record; returns the record's path. `redraw()` (files
    drawn from the records, e.g. the README's summary) is called once the record is written and committed with it,
    holding `lock` (runs that train at once take turns)."""
    target = record_path(run, paths.records)
    if target.is_file():
        return target
    if STOPPING.is_set():
        raise Stopped(f"{run.name} not started: the study is stopping")
    restore_progress(run, paths)
    output = paths.work / run.name
    output.mkdir(parents=True, exist_ok=True)
    log = output / "study.log"
    arguments = command(run, paths, study)
    with LoadSampler(output) as load:
        _aot(arguments, threads, log)
        if run.section == "language":
            _aot(zero_shot_command(output / "model", paths, output / "zero-shot"), threads, log)
    record = build_record(run, paths, study, arguments, load.wall, load.summary(), threads)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.with_suffix(".tmp")
    staging.write_text(json.dumps(record, indent=1) + "\n")
    staging.replace(target)
    with lock or contextlib.nullcontext():
        _commit_record(run, record, target, paths, commit_records, redraw)
    return target


def _commit_record(run: study_plan.Run, record: dict, target: Path, paths: Paths, commit_records: bool, redraw):
    if commit_records:
        progress = paths.records / PROGRESS / run.name
        shutil.rmtree(progress, ignore_errors=True)
        final = record["final"]
        if run.section == "language":
            result = (
                f"validation loss {final['eval_loss']:.3f}, {final['below_unigram']:.2f} nats below the unigram floor"
            )
            amount = f"{run.tokens / 1e6:.1f}M tokens"
        else:
            result, amount = f"validation accuracy {final['eval_accuracy']:.3f}", f"{run.tokens:,} images"
        try:
            drawn = redraw() if redraw else []
        except Exception as error:  # the record is committed whatever the redraw does; `--only report` redraws
            print(f"study: redraw failed, the record is committed without it: {error!r}", file=sys.stderr)
            drawn = []
        commit(
            [target, progress, *drawn],
            f"study: {run.name} ({result}; {amount}, {record['wall_seconds'] / 60:.0f} min)",
        )
