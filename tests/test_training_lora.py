"""LoRA fine-tuning in `aot train` (PEFT) for the LM and the image classifier, and the Lion optimizer option."""

from __future__ import annotations

import json
import math

import pytest
import torch

pytest.importorskip("datasets")
peft = pytest.importorskip("peft")

from transformers import (  # noqa: E402
    AutoModelForCausalLM,
    AutoModelForImageClassification,
    TrainingArguments,
)

from aot_transformers.training.arguments import PublishArguments  # noqa: E402
from aot_transformers.training.image import ImageModelArguments, train_image  # noqa: E402
from aot_transformers.training.lm import LMModelArguments, main, train_lm  # noqa: E402
from aot_transformers.training.lora import DEFAULT_TARGETS, LoraArguments, apply_lora  # noqa: E402
from aot_transformers.training.optim import OptimizerArguments, optimizer_cls_and_kwargs  # noqa: E402
from aot_transformers.training.text_data import TextDataArguments, embedded_corpus  # noqa: E402
from aot_transformers.training.vision_data import ImageDataArguments  # noqa: E402
from support import tiny_config  # noqa: E402

TINY_LM = "hidden_size=32,num_hidden_layers=2,num_attention_heads=2,vocab_size=300,max_position_embeddings=64"


def training_args(output_dir, **overrides) -> TrainingArguments:
    fields = dict(
        output_dir=str(output_dir), max_steps=4, per_device_train_batch_size=4, learning_rate=1e-2,
        report_to="none", use_cpu=True, save_strategy="no", disable_tqdm=True, seed=0, logging_steps=1,
    )  # fmt: skip
    fields.update(overrides)
    return TrainingArguments(**fields)


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("text") / "corpus.txt"
    path.write_text("\n".join(embedded_corpus()[:10]))
    return path


@pytest.fixture(scope="module")
def base_lm(tmp_path_factory, text_file):
    """A tiny trained AoT-MHSA LM folder (the base of the fine-tunes)."""
    root = tmp_path_factory.mktemp("base")
    train_lm(
        LMModelArguments(preset="aot-mhsa-l-tiny", config_overrides=TINY_LM, tokenizer_vocab_size=300),
        TextDataArguments(dataset_name=str(text_file), block_size=32),
        training_args(root / "run", max_steps=2),
        PublishArguments(make_plots=False),
    )
    return root / "run" / "model"


@pytest.mark.parametrize("attention_type", ["mssa", "mhsa"])
def test_default_targets_are_the_attention_projections(attention_type):
    from aot_transformers import AoTForCausalLM

    model = apply_lora(
        AoTForCausalLM(tiny_config(attention_type=attention_type)), LoraArguments(lora_r=2), "text-generation"
    )
    adapted = {name.split(".lora_A")[0].split(".")[-1] for name, _ in model.named_parameters() if "lora_A" in name}
    assert adapted == set(DEFAULT_TARGETS[attention_type])
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in name for name in trainable)


def test_lora_adapter_folder_loads_with_peft_and_merge_writes_a_plain_folder(tmp_path, base_lm, text_file):
    data = TextDataArguments(dataset_name=str(text_file), block_size=32)
    lora = LoraArguments(lora_r=4, lora_alpha=8, lora_dropout=0.0)
    metrics = train_lm(
        LMModelArguments(model_name_or_path=str(base_lm)), data, training_args(tmp_path / "adapter"),
        PublishArguments(make_plots=False), lora=lora,
    )  # fmt: skip
    folder = tmp_path / "adapter" / "model"
    assert metrics["final_model_dir"] == str(folder)
    names = {p.name for p in folder.iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors", "README.md", "tokenizer.json", "results.json"} <= names
    assert "model.safetensors" not in names  # an adapter, not a copy of the base
    config = json.loads((folder / "adapter_config.json").read_text())
    assert config["r"] == 4 and set(config["target_modules"]) == set(DEFAULT_TARGETS["mhsa"])
    card = (folder / "README.md").read_text()
    metadata = card.split("---")[1]
    assert "library_name: peft" in metadata and "base_model" not in metadata  # a local base: named in the text
    assert "LoRA adapter" in card and "PeftModel.from_pretrained" in card and f"`{base_lm.name}`" in card

    base = AutoModelForCausalLM.from_pretrained(base_lm, trust_remote_code=True)
    tuned = peft.PeftModel.from_pretrained(base, folder)
    ids = torch.arange(1, 17)[None]
    with torch.no_grad():
        adapted = tuned(ids).logits
        plain = AutoModelForCausalLM.from_pretrained(base_lm, trust_remote_code=True)(ids).logits
    assert not torch.allclose(adapted, plain)  # the adapters were trained

    merged = tmp_path / "merged"
    train_lm(
        LMModelArguments(model_name_or_path=str(base_lm)), data, training_args(tmp_path / "m"),
        PublishArguments(make_plots=False, final_model_dir=str(merged)),
        lora=LoraArguments(lora_r=4, lora_alpha=8, lora_dropout=0.0, merge_lora=True),
    )  # fmt: skip
    assert not (merged / "adapter_config.json").exists() and (merged / "model.safetensors").is_file()
    with torch.no_grad():
        merged_logits = AutoModelForCausalLM.from_pretrained(merged, trust_remote_code=True)(ids).logits
    torch.testing.assert_close(merged_logits, adapted, rtol=1e-4, atol=1e-4)  # same training, same seed


def test_lora_image_classifier_trains_a_new_head(tmp_path):
    data = ImageDataArguments(dataset_name="sklearn-digits", max_train_samples=128, validation_split_percentage=10)
    base_dir = tmp_path / "base"
    train_image(
        ImageModelArguments(preset="aot-v-tiny", config_overrides="image_size=8,patch_size=2,hidden_size=32"),
        data, training_args(base_dir, max_steps=2), PublishArguments(make_plots=False),
    )  # fmt: skip
    train_image(
        ImageModelArguments(model_name_or_path=str(base_dir / "model")), data, training_args(tmp_path / "lora"),
        PublishArguments(make_plots=False), lora=LoraArguments(lora_r=2),
    )  # fmt: skip
    folder = tmp_path / "lora" / "model"
    config = json.loads((folder / "adapter_config.json").read_text())
    assert config["modules_to_save"] == ["classifier"]
    base = AutoModelForImageClassification.from_pretrained(base_dir / "model", trust_remote_code=True)
    tuned = peft.PeftModel.from_pretrained(base, folder)
    assert tuned(pixel_values=torch.zeros(1, 3, 8, 8)).logits.shape == (1, 10)
    assert (folder / "preprocessor_config.json").is_file()


@pytest.mark.parametrize(
    "arguments, message",
    [
        (["--lora_r", "0"], "--lora_r 0 (allowed: a positive integer)"),
        (["--lora_r", "4", "--lora_dropout", "1.5"], "--lora_dropout 1.5"),
        (["--merge_lora", "true"], "--merge_lora True: needs --lora_r"),
        (["--lora_r", "4", "--lora_target_modules", "q_proj"], "not in this MSSA model"),
        (["--optimizer", "sgd"], "--optimizer 'sgd'"),
    ],
)
def test_bad_lora_and_optimizer_arguments_are_one_line_errors(tmp_path, capsys, text_file, arguments, message):
    status = main([
        "--preset", "aot-mssa-l-tiny", "--config_overrides", TINY_LM, "--tokenizer_vocab_size", "300",
        "--dataset_name", str(text_file), "--block_size", "32", "--max_steps", "1", "--use_cpu",
        "--report_to", "none", "--output_dir", str(tmp_path / "run"), *arguments,
    ])  # fmt: skip
    err = capsys.readouterr().err
    assert status == 2 and message in err and err.count("\n") == 1
    assert not (tmp_path / "run" / "model").exists()


def test_lion_is_the_reference_update_rule():
    """Chen et al. 2023, Algorithm 2: θ ← θ(1 − lr·λ) − lr·sign(β1·m + (1 − β1)·g); m ← β2·m + (1 − β2)·g."""
    optim = OptimizerArguments(optimizer="lion", lion_beta1=0.9, lion_beta2=0.99)
    cls, kwargs = optimizer_cls_and_kwargs(optim, training_args("unused", learning_rate=0.1, weight_decay=0.5))
    assert kwargs == {"lr": 0.1, "betas": (0.9, 0.99), "weight_decay": 0.5}
    torch.manual_seed(0)
    weight = torch.nn.Parameter(torch.randn(5))
    optimizer = cls([weight], **kwargs)
    theta, momentum = weight.detach().clone(), torch.zeros(5)
    for _ in range(3):
        grad = torch.randn(5)
        weight.grad = grad.clone()
        optimizer.step()
        theta = theta * (1 - 0.1 * 0.5) - 0.1 * torch.sign(0.9 * momentum + 0.1 * grad)
        momentum = 0.99 * momentum + 0.01 * grad
        torch.testing.assert_close(weight.detach(), theta)
    assert optimizer_cls_and_kwargs(OptimizerArguments(), training_args("unused")) is None


def test_training_with_lion_learns(tmp_path, text_file):
    metrics = train_lm(
        LMModelArguments(preset="aot-mssa-l-tiny", config_overrides=TINY_LM, tokenizer_vocab_size=300),
        TextDataArguments(dataset_name=str(text_file), block_size=32),
        training_args(tmp_path / "run", max_steps=6, learning_rate=3e-3),
        PublishArguments(make_plots=False),
        optim=OptimizerArguments(optimizer="lion"),
    )
    results = json.loads((tmp_path / "run" / "model" / "results.json").read_text())
    assert results["settings"]["optimizer"].startswith("Lion (lion_pytorch")
    assert metrics["train_loss"] < math.log(300)  # below the loss of a uniform guess over the vocabulary
    assert "| optimizer | Lion (lion_pytorch" in (tmp_path / "run" / "model" / "README.md").read_text()


def readme_commands(section: str) -> list[list[str]]:
    """The `aot ...` commands of a README section's bash block, as argument lists."""
    import re
    import shlex

    from support import REPO_ROOT

    text = (REPO_ROOT / "README.md").read_text().split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", text, re.S).group(1).replace("\\\n", " ")
    return [shlex.split(line) for line in block.splitlines() if line.startswith("aot ")]


def test_readme_lora_commands_run(tmp_path, monkeypatch):
    """README "Fine-tuning with LoRA", as written, with 2 steps per run."""
    from aot_transformers.cli import main as aot
    from support import REPO_ROOT

    data = REPO_ROOT.parent / "shared" / "data"
    if not data.is_dir():
        pytest.skip("../shared/data is not present")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    (tmp_path / "shared").symlink_to(data.parent)  # ../shared/data from the working folder
    commands = readme_commands("Fine-tuning with LoRA")
    assert len(commands) == 3 and all("--lora_r" in c for c in commands[1:])
    local = ["../shared/data/text/tinyshakespeare/input.txt"] + ["../shared/data/text/janeausten/persuasion.txt"] * 2
    for command, path in zip(commands, local, strict=True):
        steps = command.index("--max_steps")
        command[steps + 1] = "2"
        # The README names Hub datasets; this machine reads the same commands from local files.
        dataset = command.index("--dataset_name")
        command[dataset : dataset + 2] = ["--dataset_name", path]
        for flag in ("--dataset_config_name", "--streaming"):
            if flag in command:
                at = command.index(flag)
                del command[at : at + (2 if flag == "--dataset_config_name" else 1)]
        assert aot(command[1:] + ["--report_to", "none", "--make_plots", "false"]) == 0, command
    assert (tmp_path / "work" / "runs" / "lora" / "model" / "adapter_config.json").is_file()
    assert (tmp_path / "work" / "runs" / "lora-merged" / "model" / "model.safetensors").is_file()
    base = AutoModelForCausalLM.from_pretrained("runs/base/model", trust_remote_code=True)
    peft.PeftModel.from_pretrained(base, "runs/lora/model")
