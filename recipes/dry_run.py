"""The dry run of a recipe: its own command, launcher config and argument files, scaled down by its `dry_run.yaml`
(tiny preset, local data from ../shared/data, 2 CPU processes on gloo unless it says `processes`, a handful of
steps), with three checks:

1. the training loss falls;
2. a second launch of the same command with more steps resumes from the first one's checkpoint (the recipes set
   `resume_from_checkpoint: auto`) instead of starting over;
3. the exported folder loads through the Auto classes (`trust_remote_code=True`) and gives finite outputs;
4. (language models) the recipe's zero-shot evaluation, `aot eval lm … --update-card`, runs on the export (local
   PTB and LAMBADA excerpts) and writes its results into the model card.

    python recipes/dry_run.py recipes/aot-mssa-l-large-openwebtext
    python recipes/dry_run.py recipes/aot-v-base-imagenet --data-dir /data/shared --steps 6

Exits 0 when every check passes; writes `dry_run.json` (losses, steps, timings) into the output folder. Bad input
(a missing or malformed recipe, `--steps 0`, a missing data folder, …) is one line and exit code 2, a failed check or
launch one line naming its log and exit code 1 (the error contract of `aot_transformers.errors`).

The stages run in a fresh folder `<output-dir>/.dry-run.*`; only once every check has passed do its folders and logs
replace those of an earlier dry run in `<output-dir>` — a failed dry run deletes nothing and keeps its attempt (until
the next dry run into the same folder removes it, as `_io.remove_stale_staging` removes a dead writer's staging).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))  # this checkout's package, as the launched runs get it

from aot_transformers._io import STAGING_MARKER, remove_stale_staging  # noqa: E402
from aot_transformers.cli import OneLineArgumentParser  # noqa: E402
from aot_transformers.errors import RunError, UsageError, run_command  # noqa: E402

RESUME_MARK = "dry_run_resume_mark"
MODULES = {"lm": "aot_transformers.training.lm", "image": "aot_transformers.training.image"}
SPEC_FILE = "dry_run.yaml"
SPEC_KEYS = {"entry", "stages", "processes", "resume"}
STAGE_KEYS = {"name", "arguments", "overrides", "evaluate"}
# The one-line error of an `aot` command (`aot train lm: error: …`, `python -m …: error: …`).
ERROR_LINE = re.compile(r"^\S.*?: error: .+")


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return value


def load_spec(recipe: Path) -> dict:
    """The recipe's `dry_run.yaml`, checked: a mapping with a known `entry` and a list of stages, each naming an
    argument file of the recipe. Raises `UsageError` (one line naming the file and what is allowed)."""
    if not recipe.exists():
        raise UsageError("no such recipe folder", argument="recipe", value=str(recipe))
    if not recipe.is_dir():
        raise UsageError("is a file, not a recipe folder", argument="recipe", value=str(recipe))
    file = recipe / SPEC_FILE
    if not file.is_file():
        raise UsageError(
            f"has no {SPEC_FILE}", argument="recipe", value=str(recipe), allowed="a folder of recipes/ with a dry run"
        )
    try:
        spec = yaml.safe_load(file.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as error:
        where = getattr(error, "problem_mark", None)
        line = f" line {where.line + 1}" if where is not None else ""
        problem = getattr(error, "problem", None) or type(error).__name__
        raise UsageError(f"{file}{line}: not valid YAML ({problem})") from None
    if not isinstance(spec, dict):
        shown = "empty" if spec is None else f"a {type(spec).__name__}"
        raise UsageError(f"{file} is {shown}, not a mapping with `entry` and `stages`")
    unknown = sorted(map(str, set(spec) - SPEC_KEYS))
    if unknown:
        raise UsageError(f"{file}: unknown entries {unknown} (allowed: {sorted(SPEC_KEYS)})")
    if spec.get("entry") not in MODULES:
        raise UsageError(f"{file}: entry {spec.get('entry')!r} is not one of {sorted(MODULES)}")
    processes = spec.get("processes", 2)
    if isinstance(processes, bool) or not isinstance(processes, int) or processes < 1:
        raise UsageError(f"{file}: processes must be an integer >= 1 (default 2)")
    if not isinstance(spec.get("resume", True), bool):
        raise UsageError(f"{file}: resume must be true or false (default true: check that a second launch resumes)")
    stages = spec.get("stages")
    if not isinstance(stages, list) or not stages:
        raise UsageError(f"{file}: `stages` must be a non-empty list of stages")
    names = set()
    for number, stage in enumerate(stages):
        where = f"{file}: stage {number}"
        if not isinstance(stage, dict):
            raise UsageError(f"{where} is a {type(stage).__name__}, not a mapping")
        unknown = sorted(map(str, set(stage) - STAGE_KEYS))
        if unknown:
            raise UsageError(f"{where}: unknown entries {unknown} (allowed: {sorted(STAGE_KEYS)})")
        name = stage.get("name")
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", name) or name in names:
            raise UsageError(f"{where}: name {name!r} must be a unique folder name (letters, digits, _ . -)")
        names.add(name)
        arguments = stage.get("arguments")
        if not isinstance(arguments, str) or not (recipe / arguments).is_file():
            raise UsageError(f"{where}: arguments {arguments!r} is not a file of {recipe}")
        if not isinstance(stage.get("overrides", {}), dict):
            raise UsageError(f"{where}: overrides must be a mapping of argument names to values")
        if not isinstance(stage.get("evaluate", []), list):
            raise UsageError(f"{where}: evaluate must be a list of `aot eval lm` arguments")
    return spec


def check_inputs(recipe: Path, data_dir: Path, steps: int, processes: int | None) -> dict:
    """Every input of a dry run, before anything is written or launched: the recipe's spec (`load_spec`)."""
    for name, value in (("--steps", steps), ("--processes", processes)):
        if value is None and name == "--processes":
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise UsageError("is not allowed", argument=name, value=value, allowed="an integer >= 1")
    spec = load_spec(recipe)
    if not data_dir.is_dir():
        raise UsageError(
            "no such folder", argument="--data-dir", value=str(data_dir), allowed="the shared data folder"
        )
    return spec


def launch_command(recipe: Path, processes: int) -> list[str]:
    """`accelerate launch` with the recipe's own config, scaled to `processes` CPU ranks (gloo, no mixed precision:
    the training arguments' `use_cpu` puts the ranks on the CPU)."""
    accelerate = shutil.which("accelerate", path=str(Path(sys.executable).parent)) or "accelerate"
    return [
        accelerate, "launch", "--config_file", str(recipe / "accelerate.yaml"), "--num_processes", str(processes),
        "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
    ]  # fmt: skip


def as_flags(overrides: dict) -> list[str]:
    """`{"max_steps": 4, "bf16": False}` -> `["--max_steps", "4", "--bf16", "false"]` (None: left to the file)."""
    flags: list[str] = []
    for name, value in overrides.items():
        if value is None:
            continue
        if isinstance(value, bool):
            value = str(value).lower()
        elif isinstance(value, (dict, list)):
            value = json.dumps(value)
        flags += [f"--{name}", str(value)]
    return flags


def fill(value, places: dict[str, str]):
    """Replace the `{data}`, `{imagefolder}` and `{previous}` placeholders of a string value."""
    if not isinstance(value, str):
        return value
    for name, path in places.items():
        value = value.replace("{" + name + "}", path)
    return value


def write_imagefolder(data_dir: Path, target: Path, per_class: int = 24, validation_per_class: int = 4) -> Path:
    """A small imagefolder (`train/<digit>/*.png`, `validation/<digit>/*.png`) of the MNIST digits in
    `vision/mnist5k`, to stream in place of ImageNet (digits: learnable in the few steps of a dry run)."""
    import gzip

    import numpy as np
    from PIL import Image

    if (target / "train").is_dir():
        return target
    source = data_dir / "vision" / "mnist5k" / "mnist_5k.csv.gz"
    if not source.is_file():
        raise UsageError(f"no MNIST digits at {source}", argument="--data-dir", value=str(data_dir))
    counts: dict[int, int] = {}
    with gzip.open(source, "rt") as stream:
        for line in stream:
            values = [int(float(v)) for v in line.strip().split(",")]
            label, pixels = values[-1], values[:-1]
            index = counts.get(label, 0)
            if index >= per_class + validation_per_class:
                continue
            counts[label] = index + 1
            folder = target / ("train" if index < per_class else "validation") / str(label)
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(np.asarray(pixels, dtype=np.uint8).reshape(28, 28)).save(folder / f"{index:04d}.png")
    return target


def run(command: list[str], log: Path) -> float:
    """Run `command` with its output in `log`; a failure raises `RunError` with the command's own one-line error
    (or the log's last line) and the log's path."""
    start = time.perf_counter()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(ROOT / "src")}
    with log.open("w") as stream:
        completed = subprocess.run(command, stdout=stream, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    if completed.returncode != 0:
        lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
        errors = list(dict.fromkeys(line for line in lines if ERROR_LINE.match(line)))  # each rank prints its own
        cause = "; ".join(errors) if errors else (lines[-1] if lines else "no output")
        raise RunError(f"launch {log.stem} failed (exit code {completed.returncode}): {cause} [full log: {log}]")
    return round(time.perf_counter() - start, 1)


def trainer_state(output_dir: Path) -> dict:
    checkpoints = sorted(output_dir.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    if not checkpoints:
        raise RunError(f"no checkpoint in {output_dir}")
    return json.loads((checkpoints[-1] / "trainer_state.json").read_text())


def check_export(folder: Path, entry: str) -> dict:
    """Load the exported folder through the Auto classes and run it once."""
    import torch
    from transformers import AutoImageProcessor, AutoModelForCausalLM, AutoModelForImageClassification, AutoTokenizer

    if entry == "lm":
        tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
        model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)
        inputs = tokenizer("To be, or not to be", return_tensors="pt")
        outputs = model(**inputs).logits
    else:
        processor = AutoImageProcessor.from_pretrained(folder, trust_remote_code=True)
        model = AutoModelForImageClassification.from_pretrained(folder, trust_remote_code=True)
        image = (torch.rand(model.config.image_size, model.config.image_size, 3) * 255).to(torch.uint8).numpy()
        outputs = model(**processor(image, return_tensors="pt")).logits
    if not torch.isfinite(outputs).all():
        raise RunError(f"{folder}: non-finite outputs after loading through the Auto classes")
    return {"class": type(model).__name__, "output_shape": list(outputs.shape)}


def dry_run(
    recipe: Path,
    output_dir: Path,
    data_dir: Path,
    steps: int = 4,
    processes: int | None = None,
    resume_check: bool = True,
) -> dict:
    """Run every stage of `recipe`'s dry run (see the module docstring) and return the summary. `processes`
    defaults to the spec's (2 unless it says otherwise). Without `resume_check`, or with the spec's `resume: false`
    (a run that cannot resume), the first stage is launched once (check 2 is skipped).

    Every input is checked first (`UsageError`); the stages run in a new `<output_dir>/.dry-run.*` folder whose
    contents replace those of the same names in `output_dir` only once every check has passed (`RunError`
    otherwise, with nothing in `output_dir` deleted)."""
    recipe, output_dir, data_dir = Path(recipe), Path(output_dir), Path(data_dir)
    spec = check_inputs(recipe, data_dir, steps, processes)
    processes = processes or spec.get("processes", 2)
    resume_check = resume_check and spec.get("resume", True)
    entry = spec["entry"]
    module = MODULES[entry]
    output_dir.mkdir(parents=True, exist_ok=True)
    remove_stale_staging(output_dir / "dry-run")  # attempts of earlier dry runs that failed or were killed
    work = Path(tempfile.mkdtemp(prefix=".dry-run.", dir=output_dir))
    (work / STAGING_MARKER).write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname()}))
    try:
        summary = _run_stages(recipe, spec, module, entry, output_dir, work, data_dir, steps, processes, resume_check)
    except RunError as error:
        raise RunError(f"{error} (the attempt is kept in {work}; nothing in {output_dir} was replaced)") from error
    (work / "dry_run.json").write_text(json.dumps(summary, indent=2))
    _publish(work, output_dir)
    return summary


def _publish(work: Path, output_dir: Path) -> None:
    """Move every entry of `work` into `output_dir`, each replacing the entry of the same name, then remove `work`."""
    (work / STAGING_MARKER).unlink()
    replaced = work / ".replaced"
    replaced.mkdir()
    for entry in sorted(p for p in work.iterdir() if p != replaced):
        target = output_dir / entry.name
        if target.exists() or target.is_symlink():
            target.rename(replaced / entry.name)
        entry.rename(target)
    shutil.rmtree(work)


def _run_stages(recipe, spec, module, entry, output_dir, work, data_dir, steps, processes, resume_check) -> dict:
    places = {"data": str(data_dir), "previous": "", "output": str(work)}
    if entry == "image":  # a cache of the digits, kept beside the runs (written once, never deleted)
        places["imagefolder"] = str(write_imagefolder(data_dir, output_dir / "imagefolder"))
    summary: dict = {"recipe": recipe.name, "processes": processes, "stages": []}
    for number, stage in enumerate(spec["stages"]):
        stage_dir = work / stage["name"]
        overrides = {name: fill(value, places) for name, value in (stage.get("overrides") or {}).items()}
        base = [*launch_command(recipe, processes), "-m", module, str(recipe / stage["arguments"])]
        common = as_flags(overrides) + ["--output_dir", str(stage_dir), "--save_strategy", "steps"]
        # The first stage also proves resumption: a second launch with twice the steps continues from checkpoint N.
        launches = [steps, 2 * steps] if number == 0 and resume_check else [steps]
        seconds = []
        for launch, max_steps in enumerate(launches):
            if launch:  # mark the checkpoint's history: only a launch that resumes from it carries the mark on
                state_file = stage_dir / f"checkpoint-{steps}" / "trainer_state.json"
                state = json.loads(state_file.read_text())
                state["log_history"][0][RESUME_MARK] = True
                state_file.write_text(json.dumps(state))
            flags = ["--max_steps", str(max_steps), "--save_steps", str(steps)]
            seconds.append(run([*base, *common, *flags], stage_dir.with_name(f"{stage['name']}-{launch}.log")))
        state = trainer_state(stage_dir)
        losses = [(entry_["step"], entry_["loss"]) for entry_ in state["log_history"] if "loss" in entry_]
        steps_logged = [step for step, _ in losses]
        if state["global_step"] != launches[-1] or steps_logged[: launches[-1]] != list(range(1, launches[-1] + 1)):
            raise RunError(f"{stage['name']}: expected steps 1..{launches[-1]} in one history, got {steps_logged}")
        if len(launches) > 1 and not state["log_history"][0].get(RESUME_MARK):
            raise RunError(f"{stage['name']}: the second launch did not resume from checkpoint-{steps}")
        head = sum(loss for _, loss in losses[:2]) / 2
        tail = sum(loss for _, loss in losses[-2:]) / 2
        if not tail < head:
            raise RunError(f"{stage['name']}: the loss did not fall ({head:.4f} -> {tail:.4f})")
        export = check_export(stage_dir / "model", entry)
        if stage.get("evaluate"):  # the recipe's zero-shot evaluation, on local data, writing into the model card
            arguments = [fill(value, places) for value in stage["evaluate"]]
            command = [
                sys.executable,
                "-m",
                "aot_transformers.cli",
                "eval",
                "lm",
                str(stage_dir / "model"),
                *arguments,
            ]
            run(command, stage_dir.with_name(f"{stage['name']}-eval.log"))
            card = (stage_dir / "model" / "README.md").read_text()
            if "aot-eval:start" not in card or "Zero-shot evaluation" not in card:
                raise RunError(f"{stage['name']}/model: `aot eval lm --update-card` did not write the card")
            export["evaluated"] = True
        places["previous"] = str(stage_dir / "model")
        summary["stages"].append(
            {
                "name": stage["name"],
                "losses": losses,
                "seconds_per_launch": seconds,
                "resumed": len(launches) > 1,
                "export": export,
            }  # fmt: skip
        )
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = OneLineArgumentParser(
        prog="dry_run.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("recipe", help="a recipe folder, e.g. recipes/aot-mssa-l-base-openwebtext")
    parser.add_argument("--output-dir", help="default: runs/dry-run/<recipe>")
    parser.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data"))
    parser.add_argument("--steps", type=positive_int, default=4, help="optimizer steps per launch (default: 4)")
    parser.add_argument("--processes", type=positive_int, help="default: the recipe's dry_run.yaml, else 2")
    parser.add_argument("--no-resume-check", action="store_true", help="launch the first stage once")
    args = parser.parse_args(argv)

    def job() -> int:
        recipe = Path(args.recipe).resolve()
        output_dir = Path(args.output_dir or ROOT / "runs" / "dry-run" / recipe.name)
        summary = dry_run(
            recipe, output_dir, Path(args.data_dir), args.steps, args.processes, resume_check=not args.no_resume_check
        )
        for stage in summary["stages"]:
            first, last = stage["losses"][0][1], stage["losses"][-1][1]
            print(
                f"{recipe.name} {stage['name']}: loss {first:.3f} -> {last:.3f}, launches "
                f"{stage['seconds_per_launch']} s, resumed: {stage['resumed']}, export: {stage['export']['class']}"
            )
        return 0

    return run_command(job, prog="dry_run.py")


if __name__ == "__main__":
    sys.exit(main())
