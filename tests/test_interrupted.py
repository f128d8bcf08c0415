"""Training killed (SIGKILL) at random moments, several times, then resumed, ends where an uninterrupted run ends;
stopped by SIGTERM, it saves the step it was in and the same command continues from there.

The random-kill test is slow (a few minutes): `.venv/bin/python -m pytest -m slow tests/test_interrupted.py`. The kills
land at random wall-clock times — mid-step, mid-checkpoint-write, during start-up — not at step
boundaries. After every kill each checkpoint folder must be either complete and loadable or skipped on resume.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("datasets")

from transformers import AutoModelForCausalLM

from aot_transformers.training.run_state import last_complete_checkpoint
from aot_transformers.training.text_data import embedded_corpus

TINY = "hidden_size=32,num_hidden_layers=2,num_attention_heads=4,vocab_size=320,max_position_embeddings=64"
MAX_STEPS = 40


def _arguments(data: Path, output: Path) -> list[str]:
    return [
        "--preset", "aot-mssa-l-tiny", "--config_overrides", TINY, "--tokenizer_vocab_size", "300",
        "--dataset_name", str(data), "--block_size", "32", "--max_steps", str(MAX_STEPS),
        "--per_device_train_batch_size", "4", "--learning_rate", "3e-3", "--save_strategy", "steps",
        "--save_steps", "4", "--report_to", "none", "--use_cpu", "--disable_tqdm", "true", "--seed", "0",
        "--eval_strategy", "no", "--output_dir", str(output),
    ]  # fmt: skip


def _train(arguments: list[str], cwd: Path, kill_after: float | None = None) -> int:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(
        [sys.executable, "-m", "aot_transformers.training.lm", *arguments],
        env=env,
        cwd=cwd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    if kill_after is None:
        _, stderr = process.communicate(timeout=900)
        assert process.returncode == 0, stderr.decode()[-3000:]
        return 0
    try:
        process.wait(timeout=kill_after)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    return process.returncode


@pytest.mark.slow
def test_random_sigkills_then_resume_match_uninterrupted_run(tmp_path):
    lines = [line for text in embedded_corpus()[:20] for line in text.splitlines() if line.strip()][:400]
    data = tmp_path / "train.txt"
    data.write_text("\n".join(lines) + "\n")
    rng = random.Random(1234)
    run = tmp_path / "run"

    # Measure how long a run takes, then kill the interrupted one at random times within that span.
    start = time.perf_counter()
    _train(_arguments(data, tmp_path / "straight"), tmp_path)
    duration = time.perf_counter() - start

    kills = 0
    for _ in range(6):
        resume = ["--resume_from_checkpoint", "latest"] if last_complete_checkpoint(run) else []
        code = _train(_arguments(data, run) + resume, tmp_path, kill_after=rng.uniform(0.3, 0.8) * duration)
        if code == 0:
            break
        assert code == -9
        kills += 1
        latest = last_complete_checkpoint(run)
        if latest is not None:  # whatever the kill interrupted, the latest complete checkpoint loads
            AutoModelForCausalLM.from_pretrained(latest)
        assert not (run / "model").exists() or (run / "model" / "model.safetensors").exists()
    assert kills >= 2, "the kills should interrupt the run several times"
    if not (run / "model").exists():
        _train(_arguments(data, run) + ["--resume_from_checkpoint", "latest"], tmp_path)

    resumed = AutoModelForCausalLM.from_pretrained(run / "model").state_dict()
    straight = AutoModelForCausalLM.from_pretrained(tmp_path / "straight" / "model").state_dict()
    for name, value in straight.items():
        torch.testing.assert_close(resumed[name], value, rtol=1e-5, atol=1e-6, msg=name)
    print(f"\nSIGKILLs injected: {kills}; every checkpoint left behind was complete or skipped; final model equal")


def _train_until_sigterm(arguments: list[str], cwd: Path, logged_steps: int = 3) -> subprocess.CompletedProcess:
    """Start `aot train lm`, send SIGTERM once it has logged `logged_steps` losses, and wait for it to stop."""
    process = subprocess.Popen(
        [sys.executable, "-m", "aot_transformers.cli", "train", "lm", *arguments],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    seen = 0
    for line in process.stdout:  # Trainer prints each logged loss as a dict without tqdm
        seen += "'loss'" in line
        if seen >= logged_steps:
            process.send_signal(signal.SIGTERM)
            break
    stdout, stderr = process.communicate(timeout=300)
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def test_sigterm_with_jit_checkpoint_saves_the_step_under_way_and_the_same_command_continues(tmp_path):
    lines = [line for text in embedded_corpus()[:20] for line in text.splitlines() if line.strip()][:400]
    data = tmp_path / "train.txt"
    data.write_text("\n".join(lines) + "\n")
    run = tmp_path / "run"
    arguments = _arguments(data, run)
    arguments[arguments.index("--max_steps") + 1] = "100000"  # far more than a SIGTERM lets it reach
    arguments[arguments.index("--save_steps") + 1] = "100000"  # no periodic checkpoint: only the SIGTERM's
    arguments += ["--logging_steps", "1", "--enable_jit_checkpoint", "--resume_from_checkpoint", "auto"]

    first = _train_until_sigterm(arguments, tmp_path)
    assert first.returncode == 130, first.stderr[-3000:]
    saved = last_complete_checkpoint(run)
    assert saved is not None and f"the newest checkpoint is {saved}" in first.stderr.splitlines()[-1]
    step = int(Path(saved).name.removeprefix("checkpoint-"))
    assert 3 <= step < 100000 and not (run / "model").exists()  # stopped short: no final export
    AutoModelForCausalLM.from_pretrained(saved)

    second = _train_until_sigterm(arguments, tmp_path)  # the same command picks the run up at that step
    assert second.returncode == 130, second.stderr[-3000:]
    later = last_complete_checkpoint(run)
    history = json.loads((Path(later) / "trainer_state.json").read_text())["log_history"]
    logged = [entry["step"] for entry in history if "loss" in entry]
    assert int(Path(later).name.removeprefix("checkpoint-")) > step
    assert logged == sorted(set(logged)) and step in logged  # one history: the first stop's steps, then the rest


def test_a_sigterm_landing_after_the_optimizer_step_saves_that_steps_logged_loss(tmp_path):
    """transformers' JIT checkpoint, requested between a step's optimizer update and its `on_step_end` (the grace
    timer firing there), saves before Trainer logs the step: the checkpoint's history then lacks that step's loss and
    a resume never logs it. Here the request lands exactly there, at step 3: checkpoint-3 holds step 3's loss."""
    from transformers import TrainerCallback

    from aot_transformers.training.lm import parse_lm_arguments, prepare_lm_training, run_lm_training

    lines = [line for text in embedded_corpus()[:20] for line in text.splitlines() if line.strip()][:400]
    data = tmp_path / "train.txt"
    data.write_text("\n".join(lines) + "\n")
    run = tmp_path / "run"
    arguments = _arguments(data, run)
    arguments[arguments.index("--save_steps") + 1] = "100000"  # no periodic checkpoint: only the SIGTERM's
    arguments += ["--logging_steps", "1", "--enable_jit_checkpoint", "--make_plots", "false"]

    class SigtermAfterTheOptimizerStep(TrainerCallback):
        trainer = None

        def on_optimizer_step(self, args, state, control, **kwargs):
            if state.global_step == 2:  # step 3's update is done; its `on_step_end` and its log come next
                os.kill(os.getpid(), signal.SIGTERM)  # the run notes it and transformers starts its grace timer
                jit = next(c for c in self.trainer.callback_handler.callbacks if hasattr(c, "jit_manager"))
                jit.jit_manager.is_checkpoint_requested = True  # the timer firing now

    trigger = SigtermAfterTheOptimizerStep()
    model_args, data_args, publish_args, lora, optim, training_args = parse_lm_arguments(arguments)
    prepared = prepare_lm_training(model_args, data_args, training_args, publish_args, callbacks=[trigger])
    trigger.trainer = prepared.trainer
    with pytest.raises(KeyboardInterrupt, match="stopped at step 3"):
        run_lm_training(prepared)
    saved = Path(last_complete_checkpoint(run))
    assert saved.name == "checkpoint-3" and not (run / "model").exists()
    history = json.loads((saved / "trainer_state.json").read_text())["log_history"]
    assert [entry["step"] for entry in history if "loss" in entry] == [1, 2, 3]


def _processes_of(folder: Path) -> list:
    """The running processes whose command line names `folder` (a run's main process and every process forked from
    it, orphans included)."""
    import psutil

    found = []
    for process in psutil.process_iter(["cmdline", "status"]):
        command, status = process.info["cmdline"] or [], process.info["status"]
        if status != psutil.STATUS_ZOMBIE and any(str(folder) in part for part in command):
            found.append(process)
    return found


def test_a_sigterm_while_tokenizing_in_parallel_interrupts_the_run_and_leaves_no_worker_behind(tmp_path, shared_data):
    """A SIGTERM before training (here while two processes tokenize) ends the command as Ctrl-C does: exit code 130,
    `interrupted: SIGTERM`, the tokenizer pool terminated and its scratch files removed (a default SIGTERM killed the
    main process alone, and its pool went on tokenizing as orphans)."""
    import psutil
    from transformers import GPT2TokenizerFast

    GPT2TokenizerFast.from_pretrained(shared_data / "tokenizer-gpt2").save_pretrained(tmp_path / "tokenizer")
    speeches = (shared_data / "text" / "tinyshakespeare" / "input.txt").read_text(encoding="utf-8").split("\n\n")
    data = tmp_path / "train.jsonl"  # 8 MB in 64,000 rows
    data.write_text("".join(json.dumps({"text": speech}) + "\n" for speech in speeches * 8), encoding="utf-8")
    cache = tmp_path / "cache"  # a cold cache of its own, so the blocks are tokenized here
    arguments = _arguments(data, tmp_path / "run")
    arguments[arguments.index("--tokenizer_vocab_size") : arguments.index("--tokenizer_vocab_size") + 2] = [
        "--tokenizer_name_or_path", str(tmp_path / "tokenizer"), "--preprocessing_num_workers", "2",
    ]  # fmt: skip
    arguments[arguments.index("--config_overrides") + 1] = TINY.replace("vocab_size=320", "vocab_size=50257")
    errors = tmp_path / "stderr.txt"
    with open(errors, "w", encoding="utf-8") as log:  # a file: progress bars never fill a pipe
        process = subprocess.Popen(
            [sys.executable, "-m", "aot_transformers.cli", "train", "lm", *arguments],
            env={**os.environ, "OMP_NUM_THREADS": "1", "HF_DATASETS_CACHE": str(cache)},
            cwd=tmp_path,
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
        # Once the two workers have tokenized part of the text (the map's progress bar has moved off 0%).
        progress = re.compile(r"Tokenizing training text \(num_proc=2\):\s+[1-9]\d*%")
        deadline = time.monotonic() + 300
        while not progress.search(errors.read_text()) and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert process.poll() is None, f"the run should still be tokenizing: {errors.read_text()[-3000:]}"
        workers = psutil.Process(process.pid).children(recursive=True)
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=120)
    stderr = errors.read_text(encoding="utf-8")
    assert process.returncode == 130, stderr[-3000:]
    assert stderr.strip().splitlines()[-1] == "aot train lm: interrupted: SIGTERM"
    psutil.wait_procs(workers, timeout=30)  # the pool's workers, given time to end
    left = _processes_of(tmp_path)  # those and any forked after the signal
    assert not left, f"processes of the run left behind: {left}"
    assert not list((cache / "aot_blocks").glob("tmp*")), "the scratch folder of the cold cache should be removed"
