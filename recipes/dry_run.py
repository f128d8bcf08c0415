"""The dry run of a recipe: its own command, launcher config and argument files, scaled down by its `dry_run.yaml`
(tiny preset, local data from ../shared/data, 2 CPU processes on gloo, a handful of steps), with three checks:

1. the training loss falls;
2. a second launch of the same command with more steps resumes from the first one's checkpoint (the recipes set
   `resume_from_checkpoint: auto`) instead of starting over;
3. the exported folder loads through the Auto classes (`trust_remote_code=True`) and gives finite outputs;
4. (language models) the recipe's zero-shot evaluation, `aot eval lm … --update-card`, runs on the export (local
   PTB and LAMBADA excerpts) and writes its results into the model card.

    python recipes/dry_run.py recipes/aot-mssa-l-large-openwebtext
    python recipes/dry_run.py recipes/aot-v-base-imagenet --data-dir /data/shared --steps 6

Exits 0 when every check passes; writes `dry_run.json` (losses, steps, timings) into the output folder.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
RESUME_MARK = "dry_run_resume_mark"
MODULES = {"lm": "aot_transformers.training.lm", "image": "aot_transformers.training.image"}


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
        raise SystemExit(f"no MNIST digits at {source}")
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
    start = time.perf_counter()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(ROOT / "src")}
    with log.open("w") as stream:
        completed = subprocess.run(command, stdout=stream, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    if completed.returncode != 0:
        raise SystemExit(f"{' '.join(command)}\nfailed with {completed.returncode}; last lines of {log}:\n"
                         + "\n".join(log.read_text().splitlines()[-25:]))  # fmt: skip
    return round(time.perf_counter() - start, 1)


def trainer_state(output_dir: Path) -> dict:
    checkpoints = sorted(output_dir.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    if not checkpoints:
        raise SystemExit(f"no checkpoint in {output_dir}")
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
        raise SystemExit(f"{folder}: non-finite outputs after loading through the Auto classes")
    return {"class": type(model).__name__, "output_shape": list(outputs.shape)}


def dry_run(
    recipe: Path, output_dir: Path, data_dir: Path, steps: int = 4, processes: int = 2, resume_check: bool = True
) -> dict:
    """Run every stage of `recipe`'s dry run (see the module docstring) and return the summary. Without
    `resume_check` the first stage is launched once (check 2 is skipped)."""
    spec = yaml.safe_load((recipe / "dry_run.yaml").read_text())
    entry = spec["entry"]
    module = MODULES[entry]
    output_dir.mkdir(parents=True, exist_ok=True)
    places = {"data": str(data_dir), "previous": "", "output": str(output_dir)}
    if entry == "image":
        places["imagefolder"] = str(write_imagefolder(data_dir, output_dir / "imagefolder"))
    summary: dict = {"recipe": recipe.name, "processes": processes, "stages": []}
    for number, stage in enumerate(spec["stages"]):
        stage_dir = output_dir / stage["name"]
        shutil.rmtree(stage_dir, ignore_errors=True)
        overrides = {name: fill(value, places) for name, value in stage["overrides"].items()}
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
            raise SystemExit(f"{stage_dir}: expected steps 1..{launches[-1]} in one history, got {steps_logged}")
        if len(launches) > 1 and not state["log_history"][0].get(RESUME_MARK):
            raise SystemExit(f"{stage_dir}: the second launch did not resume from checkpoint-{steps}")
        head = sum(loss for _, loss in losses[:2]) / 2
        tail = sum(loss for _, loss in losses[-2:]) / 2
        if not tail < head:
            raise SystemExit(f"{stage_dir}: the loss did not fall ({head:.4f} -> {tail:.4f})")
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
                raise SystemExit(f"{stage_dir / 'model'}: `aot eval lm --update-card` did not write the card")
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
    (output_dir / "dry_run.json").write_text(json.dumps(summary, indent=2))
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("recipe", help="a recipe folder, e.g. recipes/aot-mssa-l-base-openwebtext")
    parser.add_argument("--output-dir", help="default: runs/dry-run/<recipe>")
    parser.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data"))
    parser.add_argument("--steps", type=int, default=4, help="optimizer steps per launch (default: 4)")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--no-resume-check", action="store_true", help="launch the first stage once")
    args = parser.parse_args(argv)
    recipe = Path(args.recipe).resolve()
    output_dir = Path(args.output_dir or ROOT / "runs" / "dry-run" / recipe.name)
    summary = dry_run(
        recipe, output_dir, Path(args.data_dir), args.steps, args.processes, resume_check=not args.no_resume_check
    )
    for stage in summary["stages"]:
        first, last = stage["losses"][0][1], stage["losses"][-1][1]
        print(
            f"{recipe.name} {stage['name']}: loss {first:.3f} -> {last:.3f}, launches {stage['seconds_per_launch']} s,"
            f" resumed: {stage['resumed']}, export: {stage['export']['class']}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
