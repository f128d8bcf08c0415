"""Distributed data parallel on CPU: `torchrun --nproc_per_node 2` and `accelerate launch --multi_gpu
--num_processes 2` (gloo) run the unchanged training code, the ranks stay identical, and they equal a single-process
run with the same global batch (~30-45 s per launcher)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

pytest.importorskip("datasets")
pytest.importorskip("accelerate")

from benchmarks.training.throughput import launcher_command
from safetensors.torch import load_file

# Trains with the library's own entry points, then each rank saves its parameters.
SCRIPT = textwrap.dedent(
    """
    import os
    from safetensors.torch import save_file
    from aot_transformers.training.lm import parse_lm_arguments, prepare_lm_training, run_lm_training

    model_args, data_args, publish_args, lora, optim, training_args = parse_lm_arguments()
    run = prepare_lm_training(model_args, data_args, training_args, publish_args)
    run_lm_training(run)
    if run.trainer.is_fsdp_enabled:  # really sharded (DTensors): gather the full weights on every rank
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        full = get_model_state_dict(run.trainer.model, options=StateDictOptions(full_state_dict=True))
    else:
        full = run.trainer.accelerator.unwrap_model(run.trainer.model).state_dict()
    state = {k: v.detach().clone().contiguous() for k, v in full.items() if k != "lm_head.weight"}
    rank = int(os.environ.get("RANK", 0))
    save_file(state, os.path.join(training_args.output_dir, f"rank{rank}.safetensors"))
    assert training_args.world_size == int(os.environ.get("WORLD_SIZE", 1))
    """
)


def _arguments(text_file: Path, output_dir: Path, batch_size: int) -> list[str]:
    return [
        "--preset", "aot-mssa-l-tiny",
        "--config_overrides", "hidden_size=32,num_hidden_layers=2,vocab_size=320,max_position_embeddings=64",
        "--tokenizer_vocab_size", "300", "--dataset_name", str(text_file), "--block_size", "32",
        "--max_steps", "6", "--learning_rate", "3e-3", "--per_device_train_batch_size", str(batch_size),
        "--report_to", "none", "--use_cpu", "--save_strategy", "no", "--eval_strategy", "no",
        "--disable_tqdm", "true", "--seed", "0", "--make_plots", "false", "--output_dir", str(output_dir),
    ]  # fmt: skip


def _launcher(name: str) -> list[str]:
    executable = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    if executable is None:
        pytest.skip(f"{name} not found")
    return launcher_command(executable)  # the benchmark's launcher, so the test covers the measured command


def _two_vs_one(tmp_path: Path, extra: list[str], launcher: str = "torchrun") -> None:
    from aot_transformers.training.text_data import embedded_corpus

    command = _launcher(launcher)
    text_file = tmp_path / "corpus.txt"
    text_file.write_text("\n".join(embedded_corpus()[:12]))
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}

    two = subprocess.run(
        [*command, str(script),
         *_arguments(text_file, tmp_path / "two", batch_size=4), *extra],
        env=env, capture_output=True, text=True, cwd=tmp_path,
    )  # fmt: skip
    assert two.returncode == 0, two.stderr[-3000:]
    one = subprocess.run(
        [sys.executable, str(script), *_arguments(text_file, tmp_path / "one", batch_size=8)],
        env=env,
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert one.returncode == 0, one.stderr[-3000:]

    rank0 = load_file(str(tmp_path / "two" / "rank0.safetensors"))
    rank1 = load_file(str(tmp_path / "two" / "rank1.safetensors"))
    single = load_file(str(tmp_path / "one" / "rank0.safetensors"))
    for name, value in rank0.items():
        assert torch.equal(value, rank1[name]), f"{name} differs across ranks: gradients were not synchronised"
        torch.testing.assert_close(value, single[name], rtol=1e-4, atol=1e-6, msg=name)
    # Only rank 0 writes the final folder; it holds the full (gathered) weights of the single-process run.
    final = load_file(str(tmp_path / "two" / "model" / "model.safetensors"))
    for name, value in final.items():
        if name in single:
            torch.testing.assert_close(value, single[name], rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("launcher", ["torchrun", "accelerate"])
def test_two_processes_match_one_process_with_the_same_global_batch(tmp_path, launcher):
    _two_vs_one(tmp_path, [], launcher)


@pytest.mark.slow
def test_fsdp_two_processes_match_one_process(tmp_path):
    """FSDP (version 2, one shard per AoTLayer) on CPU: `pytest -m slow tests/test_training_distributed.py`."""
    config = '{"transformer_layer_cls_to_wrap": ["AoTLayer"], "version": 2}'
    _two_vs_one(tmp_path, ["--fsdp", "full_shard", "--fsdp_config", config])
