"""The papers' recipes (`recipes/`): every argument file parses into the paper's settings, every dry run is the
recipe's own command scaled down, and the dry runs execute — 2 CPU processes on gloo, loss falls, a second launch
resumes from the checkpoint, the export loads through the Auto classes — with FSDP2 as a first-class path: the
FSDP recipe's loss curve equals the DDP recipe's and its export is a plain safetensors folder.

CI runs three dry runs (~2-3 min on 2 shared cores): the DDP LM recipe (AoT-MSSA-L Base), the FSDP LM recipe
(AoT-MSSA-L Large) and the TP x FSDP one. Scaled down, AoT-MSSA-L Medium is the same run as Base and AoT-V Large /
Huge the same as AoT-V Base (`test_scaled_down_recipes_coincide` checks it); their dry runs, AoT-MHSA-L Base's (one
launch), AoT-V Base's (both stages: Lion, then AdamW) and those of the ICML vision recipes (AoT-MSSA-V, AoT-MHSA-V):
`pytest -m slow tests/test_recipes.py` or `python recipes/dry_run.py recipes/<name>`.
"""

from __future__ import annotations

import json
import re
import sys

import pytest
import torch
import yaml

pytest.importorskip("datasets")
pytest.importorskip("accelerate")

from safetensors.torch import load_file

from support import REPO_ROOT

RECIPES = REPO_ROOT / "recipes"
DATA = REPO_ROOT.parent / "shared" / "data"
from recipes import dry_run  # noqa: E402

LM_RECIPES = sorted(p.name for p in RECIPES.glob("aot-m*-l-*-openwebtext"))
VISION_RECIPES = sorted(p.name for p in RECIPES.glob("aot-*-imagenet"))
PAPERS = REPO_ROOT.parent / "shared" / "papers"
# What a dry run may change: scale (model size, steps, batch), data, devices and logging — never the method.
SCALE_KEYS = {
    "preset", "config_overrides", "tokenizer_name_or_path", "dataset_name", "streaming_validation_examples",
    "block_size", "per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps",
    "learning_rate", "lr_scheduler_type", "lr_scheduler_kwargs", "warmup_steps", "eval_strategy", "max_eval_samples",
    "logging_steps", "bf16", "dataloader_num_workers", "report_to", "use_cpu", "make_plots", "image_column",
    "label_column", "num_labels", "shuffle_buffer_size", "crop_padding", "model_name_or_path",
}  # fmt: skip
ADAMW_NANOGPT = {"learning_rate": 6e-4, "warmup_steps": 2000, "weight_decay": 0.1, "adam_beta2": 0.95}

needs_data = pytest.mark.skipif(not DATA.is_dir(), reason="../shared/data is not present")


def parse(recipe: str, file: str):
    """The dataclasses a recipe file parses into, as `aot train` would parse them."""
    from aot_transformers.training.image import parse_image_arguments
    from aot_transformers.training.lm import parse_lm_arguments

    parse_ = parse_lm_arguments if recipe.endswith(("openwebtext", "openwebtext-tp")) else parse_image_arguments
    # --use_cpu: bf16 on a machine without a GPU is refused otherwise
    return parse_([str(RECIPES / recipe / file), "--output_dir", "/tmp/unused", "--use_cpu", "true"])


@pytest.mark.parametrize("recipe", LM_RECIPES)
def test_lm_recipes_parse_into_the_papers_settings(recipe):
    from aot_transformers import AoTConfig
    from aot_transformers.presets import PAPER_PARAMETERS

    model, data, _, lora, optim, training = parse(recipe, "train.yaml")
    assert data.block_size == 1024 and data.streaming and data.dataset_name == "Skylion007/openwebtext"
    assert model.tokenizer_name_or_path == "openai-community/gpt2"
    assert optim.optimizer == "trainer" and not lora.enabled
    for name, value in ADAMW_NANOGPT.items():
        assert getattr(training, name) == pytest.approx(value), name
    global_batch = training.per_device_train_batch_size * training.gradient_accumulation_steps * 8
    assert global_batch == 480  # nanoGPT's 491,520 tokens per step on 8 GPUs
    assert training.max_steps == 600_000 and training.lr_scheduler_kwargs == {"min_lr": 6e-5}
    assert bool(training.fsdp) == ("large" in recipe)  # FSDP for Large only
    if "large" in recipe:
        assert training.fsdp_config["transformer_layer_cls_to_wrap"] == ["AoTLayer"]
        assert training.fsdp_config["version"] == 2
    assert model.preset in PAPER_PARAMETERS
    AoTConfig.from_preset(model.preset).validate()
    readme = (RECIPES / recipe / "README.md").read_text()
    assert f"recipes/{recipe}/train.yaml" in readme and "--num_machines" in readme and "--nnodes" in readme
    assert "aot eval lm" in readme and "lm_eval" in readme


# Each vision recipe follows one paper (../shared/papers): per stage (file, optimizer, learning rate, weight decay,
# label smoothing, global batch). The earlier version gives no label smoothing (0 here).
EARLIER_VERSION = (
    ("pretrain.yaml", "lion", 1e-4, 0.05, 0.0, 4096),
    ("finetune.yaml", "trainer", 5e-5, 0.05, 0.0, 2048),
)
VISION_SETTINGS = {
    "aot-v-base-imagenet": ("aot-earlier-version.txt:365", EARLIER_VERSION),
    "aot-v-large-imagenet": ("aot-earlier-version.txt:365", EARLIER_VERSION),
    "aot-v-huge-imagenet": ("aot-earlier-version.txt:365", EARLIER_VERSION),
    "aot-mssa-v-imagenet": (
        "aot-icml2025.txt:198",
        (("pretrain.yaml", "lion", 2e-4, 0.7, 0.2, 4096), ("finetune.yaml", "lion", 5e-4, 0.3, 0.1, 2048)),
    ),
    "aot-mhsa-v-imagenet": ("aot-icml2025.txt:206", (("train.yaml", "lion", 5e-4, 0.1, 0.1, 2048),)),
}


def test_every_vision_recipe_has_its_papers_settings():
    assert sorted(VISION_SETTINGS) == VISION_RECIPES


@pytest.mark.parametrize("recipe", VISION_RECIPES)
def test_vision_recipes_parse_into_the_papers_settings(recipe):
    source, stages = VISION_SETTINGS[recipe]
    for file, optimizer, lr, wd, smoothing, batch in stages:
        model, data, _, lora, optim, training = parse(recipe, file)
        assert optim.optimizer == optimizer and data.streaming and not lora.enabled
        assert (training.learning_rate, training.weight_decay, training.label_smoothing_factor) == (lr, wd, smoothing)
        assert training.per_device_train_batch_size * training.gradient_accumulation_steps * 8 == batch
        assert source in (RECIPES / recipe / file).read_text()  # each argument file cites its paper's line
    if len(stages) == 2:
        assert model.model_name_or_path.endswith("in21k/model")  # fine-tuning starts from the pre-trained folder


@pytest.mark.skipif(not PAPERS.is_dir(), reason="../shared/papers is not present")
@pytest.mark.parametrize("recipe", VISION_RECIPES)
def test_vision_recipe_expects_the_papers_numbers_and_its_preset_has_the_papers_size(recipe):
    """The README's expected accuracy and size are printed on the paper line it cites, and the recipe's preset has
    that many parameters (within the preset's stated tolerance)."""
    from aot_transformers import AoTConfig, AoTForImageClassification
    from aot_transformers.presets import PAPER_PARAMETERS

    readme = (RECIPES / recipe / "README.md").read_text()
    expected = readme[readme.index("## Expected") :].split("##")[1]
    file, line = re.search(r"`([\w.-]+\.txt):(\d+)`", expected).groups()
    accuracy, size = re.search(r"(\d+M) parameters.*\*\*(\d+\.\d)% top-1\*\*", expected, re.S).groups()[::-1]
    printed = (PAPERS / file).read_text().splitlines()[int(line) - 1]
    assert f"{accuracy}%" in printed and size in printed, printed
    first = VISION_SETTINGS[recipe][1][0][0]
    model = parse(recipe, first)[0]
    paper_count, tolerance, cited = PAPER_PARAMETERS[model.preset]
    assert cited.startswith(f"{file}:{line}") and paper_count == int(size[:-1]) * 1_000_000
    with torch.device("meta"):
        count = sum(p.numel() for p in AoTForImageClassification(AoTConfig.from_preset(model.preset)).parameters())
    assert abs(count / paper_count - 1) <= tolerance, f"{model.preset}: {count / 1e6:.2f}M"


def test_dry_runs_change_only_the_scale():
    for recipe in LM_RECIPES + VISION_RECIPES:
        spec = yaml.safe_load((RECIPES / recipe / "dry_run.yaml").read_text())
        for stage in spec["stages"]:
            assert (RECIPES / recipe / stage["arguments"]).is_file()
            changed = set(stage["overrides"]) - SCALE_KEYS
            assert not changed, f"{recipe} {stage['name']}: the dry run changes {changed}"


def test_scaled_down_recipes_coincide():
    """What CI runs covers the rest: scaled down, Medium is Base's run, and AoT-V Large / Huge are AoT-V Base's."""

    def scaled(recipe: str) -> list:
        spec = yaml.safe_load((RECIPES / recipe / "dry_run.yaml").read_text())
        runs = []
        for stage in spec["stages"]:
            arguments = yaml.safe_load((RECIPES / recipe / stage["arguments"]).read_text())
            merged = {**arguments, **stage["overrides"]}
            runs.append({k: v for k, v in merged.items() if k not in ("output_dir", "model_name") and v is not None})
        return runs

    assert scaled("aot-mssa-l-medium-openwebtext") == scaled("aot-mssa-l-base-openwebtext")
    assert scaled("aot-v-large-imagenet") == scaled("aot-v-base-imagenet")
    assert scaled("aot-v-huge-imagenet") == scaled("aot-v-base-imagenet")


@pytest.fixture(scope="module")
def dry_runs(tmp_path_factory):
    """The dry runs CI executes, once per session: name -> summary (and folder)."""
    if not DATA.is_dir():
        pytest.skip("../shared/data is not present")
    root = tmp_path_factory.mktemp("dry-runs")
    runs = {}
    for recipe, resume in (("aot-mssa-l-base-openwebtext", True), ("aot-mssa-l-large-openwebtext", True)):
        runs[recipe] = (dry_run.dry_run(RECIPES / recipe, root / recipe, DATA, steps=4, resume_check=resume), root)
    return runs


@needs_data
@pytest.mark.parametrize("recipe", ["aot-mssa-l-base-openwebtext", "aot-mssa-l-large-openwebtext"])
def test_dry_run(dry_runs, recipe):
    summary, _ = dry_runs[recipe]
    for stage in summary["stages"]:
        losses = [loss for _, loss in stage["losses"]]
        assert losses[-1] < losses[0]  # dry_run.py raised already if not; recorded here for the report
    assert summary["stages"][0]["resumed"] == (recipe != "aot-mhsa-l-base-openwebtext")
    expected = "AoTForCausalLM" if "openwebtext" in recipe else "AoTForImageClassification"
    assert {stage["export"]["class"] for stage in summary["stages"]} == {expected}
    if "openwebtext" in recipe:  # the recipe's zero-shot evaluation ran and wrote into the card
        assert summary["stages"][0]["export"]["evaluated"]


@needs_data
def test_fsdp_loss_curve_equals_ddp_and_exports_a_plain_folder(dry_runs):
    """FSDP2 (Accelerate's plugin, one shard unit per AoTLayer, 2 CPU ranks on gloo) against DDP on the same
    scaled-down run: equal loss at every step (before and after resuming from the sharded run's checkpoint), equal
    final weights, and a final folder of one safetensors file that loads without FSDP."""
    ddp, root = dry_runs["aot-mssa-l-base-openwebtext"]
    fsdp, _ = dry_runs["aot-mssa-l-large-openwebtext"]
    ddp_losses, fsdp_losses = ddp["stages"][0]["losses"], fsdp["stages"][0]["losses"]
    assert [s for s, _ in fsdp_losses] == list(range(1, 9)) and fsdp["stages"][0]["resumed"]
    torch.testing.assert_close(
        torch.tensor([loss for _, loss in fsdp_losses]),
        torch.tensor([loss for _, loss in ddp_losses]),
        rtol=1e-5,
        atol=1e-5,
    )
    # really sharded: the checkpoints are FSDP distributed checkpoints (one shard per rank), not a DDP state dict
    checkpoint = root / "aot-mssa-l-large-openwebtext" / "train" / "checkpoint-4"
    assert (checkpoint / "pytorch_model_fsdp_0").is_dir() and not list(checkpoint.glob("*.safetensors"))
    folder = root / "aot-mssa-l-large-openwebtext" / "train" / "model"
    assert [p.name for p in folder.glob("*.safetensors")] == ["model.safetensors"]
    assert not list(folder.glob("pytorch_model_fsdp*")) and "auto_map" in json.loads(
        (folder / "config.json").read_text()
    )
    sharded = load_file(str(folder / "model.safetensors"))
    replicated = load_file(str(root / "aot-mssa-l-base-openwebtext" / "train" / "model" / "model.safetensors"))
    assert sharded.keys() == replicated.keys()
    for name, value in sharded.items():
        # FSDP's reduce-scatter sums in another order than DDP's all-reduce; AdamW's normalised steps carry that
        # float noise into the weights (measured: relative difference <= 2.3e-5, largest entry 3.4e-5 after 8 steps)
        difference = value - replicated[name]
        assert difference.abs().max() < 1e-4 and difference.norm() < 1e-4 * replicated[name].norm(), name
    card = (folder / "README.md").read_text()
    assert "FSDP2 (sharded by AoTLayer)" in card


TP_RECIPE = "aot-mssa-l-large-openwebtext-tp"


def test_tensor_parallel_recipe_is_the_fsdp_recipe_with_tensor_parallelism():
    """The TP x FSDP recipe trains what the FSDP recipe trains (same file but for the parallelism and checkpoints),
    on 40 processes: tensor parallel 5 (a divisor of the Large preset's 25 heads) x 8 FSDP shards of 60 sequences."""
    from aot_transformers import AoTConfig

    tp, fsdp = (
        yaml.safe_load((RECIPES / name / "train.yaml").read_text())
        for name in (TP_RECIPE, "aot-mssa-l-large-openwebtext")
    )
    parallelism = {
        "output_dir",
        "fsdp",
        "fsdp_config",
        "resume_from_checkpoint",
        "parallelism_config",
        "save_only_model",
    }
    assert {k: v for k, v in tp.items() if k not in parallelism} == {
        k: v for k, v in fsdp.items() if k not in parallelism
    }
    sizes = tp["parallelism_config"]
    launcher = yaml.safe_load((RECIPES / TP_RECIPE / "accelerate.yaml").read_text())
    assert sizes["tp_size"] * sizes["dp_shard_size"] == launcher["num_processes"] == 40
    assert AoTConfig.from_preset(tp["preset"]).num_attention_heads % sizes["tp_size"] == 0
    assert sizes["dp_shard_size"] * tp["per_device_train_batch_size"] * tp["gradient_accumulation_steps"] == 480
    assert tp["save_only_model"] and "fsdp" not in tp and "resume_from_checkpoint" not in tp
    training = parse(TP_RECIPE, "train.yaml")[-1]
    assert training.parallelism_config == sizes and not training.fsdp
    spec = yaml.safe_load((RECIPES / TP_RECIPE / "dry_run.yaml").read_text())
    (stage,) = spec["stages"]
    assert set(stage["overrides"]) - SCALE_KEYS == {"parallelism_config"}
    assert spec["processes"] == 4 == stage["overrides"]["parallelism_config"]["tp_size"] * 2 and not spec["resume"]


@pytest.fixture(scope="module")
def tensor_parallel_runs(tmp_path_factory, dry_runs):
    """The TP x FSDP dry run (4 processes, one launch), beside the FSDP recipe's (2 processes) of `dry_runs`, whose
    first launch trains the same 4 steps."""
    if not DATA.is_dir():
        pytest.skip("../shared/data is not present")
    root = tmp_path_factory.mktemp("tp-runs")
    tp = dry_run.dry_run(RECIPES / TP_RECIPE, root / TP_RECIPE, DATA, steps=4, resume_check=False)
    return {TP_RECIPE: tp, "aot-mssa-l-large-openwebtext": dry_runs["aot-mssa-l-large-openwebtext"][0]}, root


@needs_data
def test_tensor_parallel_dry_run_follows_the_fsdp_run_and_exports_a_plain_folder(tensor_parallel_runs):
    """Tensor parallel 2 x FSDP2 2 on 4 CPU processes (gloo) against FSDP2 on 2: the same batches (the first step's
    loss is equal: same data, same initial weights), a loss within 1e-4 of the FSDP run's at every step (AdamW's
    normalised steps carry the float noise of the other reduction order), a falling loss, and a final folder of one
    safetensors file that loads through the Auto classes and was evaluated."""
    runs, root = tensor_parallel_runs
    tp, fsdp = runs[TP_RECIPE], runs["aot-mssa-l-large-openwebtext"]
    assert tp["processes"] == 4 and not tp["stages"][0]["resumed"]
    tp_losses = [loss for _, loss in tp["stages"][0]["losses"]]
    fsdp_losses = [loss for step, loss in fsdp["stages"][0]["losses"] if step <= 4]  # its first launch
    assert len(tp_losses) == 4 and tp_losses[-1] < tp_losses[0]
    assert tp_losses[0] == pytest.approx(fsdp_losses[0], rel=1e-6)
    torch.testing.assert_close(torch.tensor(tp_losses), torch.tensor(fsdp_losses), rtol=1e-4, atol=0)
    assert tp["stages"][0]["export"]["class"] == "AoTForCausalLM" and tp["stages"][0]["export"]["evaluated"]
    folder = root / TP_RECIPE / "train" / "model"
    assert [p.name for p in folder.glob("*.safetensors")] == ["model.safetensors"]
    assert "distributed_config" not in json.loads((folder / "config.json").read_text())
    assert "tensor parallel 2 x FSDP2 2" in (folder / "README.md").read_text()


@needs_data
@pytest.mark.slow
@pytest.mark.parametrize(
    "recipe",
    [
        "aot-mhsa-l-base-openwebtext",
        "aot-v-base-imagenet",
        "aot-mssa-l-medium-openwebtext",
        "aot-v-large-imagenet",
        "aot-v-huge-imagenet",
        "aot-mssa-v-imagenet",
        "aot-mhsa-v-imagenet",
    ],
)
def test_dry_run_of_the_recipes_ci_does_not_run(tmp_path, recipe):
    summary = dry_run.dry_run(RECIPES / recipe, tmp_path, DATA, steps=4)
    assert summary["stages"][0]["resumed"]


def _bad_recipe(tmp_path, case: str):
    """A recipe folder (or path) broken in one way, and the extra command-line flags of the case."""
    source = RECIPES / "aot-mssa-l-base-openwebtext"
    recipe = tmp_path / "recipe"
    if case == "missing":
        return recipe, []
    if case == "a file":
        recipe.write_text("x")
        return recipe, []
    recipe.mkdir()
    if case == "empty folder":
        return recipe, []
    for name in ("train.yaml", "accelerate.yaml"):
        (recipe / name).write_text((source / name).read_text())
    spec = (source / "dry_run.yaml").read_text()
    text = {
        "malformed YAML": "entry: lm\nstages: [\n  - name: {oops\n",
        "non-mapping YAML": "- entry\n- lm\n",
        "empty YAML": "",
        "unknown entry": spec.replace("entry: lm", "entry: lm\nentree: image"),
        "unknown entry value": spec.replace("entry: lm", "entry: audio"),
        "missing argument file": spec.replace("arguments: train.yaml", "arguments: nope.yaml"),
    }.get(case, spec)
    (recipe / "dry_run.yaml").write_text(text)
    flags = {"--processes 0": ["--processes", "0"], "--steps 0": ["--steps", "0"]}.get(case, [])
    if case == "missing data folder":
        flags = ["--data-dir", str(tmp_path / "no-data")]
    return recipe, flags


@pytest.mark.parametrize(
    "case",
    [
        "missing",
        "a file",
        "empty folder",
        "malformed YAML",
        "non-mapping YAML",
        "empty YAML",
        "unknown entry",
        "unknown entry value",
        "missing argument file",
        "--processes 0",
        "--steps 0",
        "missing data folder",
    ],
)
def test_dry_run_bad_inputs_are_one_line_and_delete_nothing(tmp_path, capsys, case):
    recipe, flags = _bad_recipe(tmp_path, case)
    output = tmp_path / "out"
    (output / "train").mkdir(parents=True)
    (output / "train" / "earlier-run.txt").write_text("kept")
    try:
        code = dry_run.main([str(recipe), "--output-dir", str(output), "--data-dir", str(tmp_path), *flags])
    except SystemExit as exit_:  # argparse's own one-line error
        code = exit_.code
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "error:" in err and "Traceback" not in err, err
    assert (output / "train" / "earlier-run.txt").read_text() == "kept"
    assert sorted(p.name for p in output.iterdir()) == ["train"]  # nothing launched, nothing written


@needs_data
def test_a_failed_dry_run_shows_the_runs_own_error_and_replaces_nothing(tmp_path, capsys):
    import os
    import socket
    import subprocess

    from aot_transformers._io import STAGING_MARKER

    source = RECIPES / "aot-mssa-l-base-openwebtext"
    recipe = tmp_path / "recipe"
    recipe.mkdir()
    for name in ("train.yaml", "accelerate.yaml"):
        (recipe / name).write_text((source / name).read_text())
    # a value the training command refuses at once: the launch fails with its own one-line error
    (recipe / "dry_run.yaml").write_text(
        (source / "dry_run.yaml").read_text().replace("block_size: 64", "block_size: 0")
    )
    output = tmp_path / "out"
    (output / "train").mkdir(parents=True)
    (output / "train" / "earlier-run.txt").write_text("kept")
    # attempts of earlier dry runs: one whose process is gone (removed), one still running (kept)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    for name, pid in ((".dry-run.gone", int(dead.stdout)), (".dry-run.running", os.getpid())):
        (output / name).mkdir()
        (output / name / STAGING_MARKER).write_text(json.dumps({"pid": pid, "host": socket.gethostname()}))
    code = dry_run.main([str(recipe), "--output-dir", str(output), "--data-dir", str(DATA), "--processes", "1"])
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 1 and len(lines) == 1, err
    assert "--block_size 0: must be at least 1" in lines[0] and "full log:" in lines[0]
    assert (output / "train" / "earlier-run.txt").read_text() == "kept"
    assert not (output / "train" / "checkpoint-4").exists()
    attempts = sorted(p.name for p in output.glob(".dry-run.*"))
    assert ".dry-run.gone" not in attempts and ".dry-run.running" in attempts and len(attempts) == 2
    (this,) = set(attempts) - {".dry-run.running"}
    assert this in lines[0]  # this attempt is kept, and named in the error
