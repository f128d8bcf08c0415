"""Data loss: a training run never deletes, overwrites or mixes up files it does not own.

The final folder, what a checkpoint and a cached tokenizer were made from, the output folder's lock, divergence, the
output folder itself, markers a kill can break, extra files, stale staging folders, re-running a finished job, a
second run into a used folder, and a kill between two files of one checkpoint.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

pytest.importorskip("datasets")

from aot_transformers import AoTConfig, AoTForCausalLM, export_model
from aot_transformers._io import LOCK_FILE, STAGING_MARKER, atomic_write_text
from aot_transformers.cli import main
from aot_transformers.errors import UsageError
from aot_transformers.hub import EXPORT_MANIFEST, check_replaceable
from aot_transformers.training.run_state import RUN_RECORD, last_complete_checkpoint


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """A few kilobytes of text: enough for a 300-token BPE and blocks of 32 tokens, fast to train on."""
    rng = random.Random(0)
    words = ["alpha", "beta", "gamma", "delta", "king", "queen", "sword", "crown", "night", "day", "the", "and"]
    lines = [" ".join(rng.choice(words) for _ in range(12)) for _ in range(400)]
    path = tmp_path_factory.mktemp("data") / "corpus.txt"
    path.write_text("\n".join(lines) + "\n")
    return path


def tiny(corpus: Path, output_dir: Path, *extra: str) -> list[str]:
    return [
        "train",
        "lm",
        "--preset",
        "aot-mssa-l-tiny",
        "--config_overrides",
        "hidden_size=32,num_hidden_layers=1,num_attention_heads=2,vocab_size=300",
        "--tokenizer_vocab_size",
        "300",
        "--block_size",
        "32",
        "--use_cpu",
        "--report_to",
        "none",
        "--per_device_train_batch_size",
        "4",
        "--dataset_name",
        str(corpus),
        "--output_dir",
        str(output_dir),
        "--max_steps",
        "2",
        "--save_steps",
        "1",
        "--make_plots",
        "false",
        *extra,
    ]


def run(argv: list[str], capsys) -> tuple[int, str]:
    code = main(argv)
    return code, capsys.readouterr().err


# The final folder replaces only an earlier export.


def test_final_model_dir_holding_user_files_is_refused_before_training(corpus, tmp_path, capsys):
    keep = tmp_path / "keep"
    keep.mkdir()
    (keep / "notes.txt").write_text("x")
    code, err = run(tiny(corpus, tmp_path / "a", "--final_model_dir", str(keep)), capsys)
    assert code == 2 and "--final_model_dir" in err and "keep" in err and err.count("error:") == 1
    assert (keep / "notes.txt").read_text() == "x"
    assert not list((tmp_path / "a").glob("checkpoint-*"))  # refused before the first step


@pytest.mark.parametrize("where", ["output_dir", "parent"])
def test_final_model_dir_that_is_the_output_folder_or_its_parent_is_refused(corpus, tmp_path, where, capsys):
    output = tmp_path / "runs" / "a"
    output.mkdir(parents=True)
    (output / "precious.txt").write_text("y")
    final = output if where == "output_dir" else tmp_path / "runs"
    code, err = run(tiny(corpus, output, "--final_model_dir", str(final)), capsys)
    assert code == 2 and "--final_model_dir" in err and ("output folder" in err)
    assert (output / "precious.txt").read_text() == "y"


def test_hf_upload_of_an_export_publishes_no_bookkeeping_and_an_older_export_is_still_replaceable(tmp_path):
    from huggingface_hub.utils import filter_repo_objects
    from huggingface_hub.utils._paths import DEFAULT_IGNORE_PATTERNS

    model = AoTForCausalLM(AoTConfig.from_preset("aot-mssa-l-tiny", hidden_size=32, num_hidden_layers=1))
    folder = export_model(model, tmp_path / "export")
    files = [p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()]
    uploaded = set(filter_repo_objects(files, ignore_patterns=DEFAULT_IGNORE_PATTERNS))  # what `hf upload` sends
    assert EXPORT_MANIFEST in files and uploaded == set(files) - {EXPORT_MANIFEST}
    assert "config.json" in uploaded and not any(name.startswith(".") for name in uploaded)
    (folder / EXPORT_MANIFEST).rename(folder / ".aot_export.json")  # where exports kept it before
    export_model(model, folder)
    assert (folder / EXPORT_MANIFEST).is_file() and not (folder / ".aot_export.json").exists()


def test_export_replaces_an_earlier_export_but_never_a_folder_with_other_files(tmp_path):
    model = AoTForCausalLM(AoTConfig.from_preset("aot-mssa-l-tiny", hidden_size=32, num_hidden_layers=1))
    folder = export_model(model, tmp_path / "export")
    assert (folder / EXPORT_MANIFEST).is_file()
    export_model(model, folder)  # an earlier export: replaced
    (folder / "my-notes.md").write_text("mine")
    with pytest.raises(UsageError, match="my-notes.md"):
        export_model(model, folder)
    assert (folder / "my-notes.md").read_text() == "mine"
    other = tmp_path / "other"
    other.mkdir()
    (other / "data.csv").write_text("1,2")
    with pytest.raises(UsageError, match="no earlier aot export"):
        export_model(model, other)
    assert (other / "data.csv").exists()
    with pytest.raises(UsageError, match="output folder"):
        check_replaceable(tmp_path, protected=(tmp_path / "export" / "run",))


# One run per output folder.


def test_second_run_on_a_locked_output_folder_fails_at_once(corpus, tmp_path, capsys):
    output = tmp_path / "a"
    output.mkdir()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                f"""
                import sys, time
                from filelock import FileLock
                lock = FileLock({str(output / LOCK_FILE)!r}); lock.acquire()
                print("held", flush=True); time.sleep(60)
                """
            ),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        code, err = run(tiny(corpus, output), capsys)
    finally:
        holder.kill()
        holder.wait()
    assert code == 2 and "another aot run holds" in err and LOCK_FILE in err
    assert not list(output.glob("checkpoint-*"))
    code, _ = run(tiny(corpus, output), capsys)  # the lock dies with its holder
    assert code == 0


# A diverged run is a failure and exports nothing.


def test_diverged_run_fails_and_exports_nothing_and_keeps_only_finite_checkpoints(corpus, tmp_path, capsys):
    output = tmp_path / "a"
    code, err = run(tiny(corpus, output, "--learning_rate", "1e30", "--max_steps", "6"), capsys)
    errors = [line for line in err.splitlines() if "error:" in line]
    assert code == 1 and len(errors) == 1 and "diverged at step" in errors[0]
    assert not (output / "model").exists()
    step = int(err.split("diverged at step ")[1].split(":")[0])
    assert sorted(int(p.name.split("-")[1]) for p in output.glob("checkpoint-*")) == list(range(1, step))
    for checkpoint in output.glob("checkpoint-*"):  # every checkpoint written holds finite weights
        weights = load_file(checkpoint / "model.safetensors")
        assert all(torch.isfinite(t).all() for t in weights.values())


def test_diverged_run_keeps_the_checkpoints_saved_before_it_and_releases_its_lock(corpus, tmp_path, capsys):
    """Diverge at step 3 of a run that saved steps 1 and 2: both stay, nothing later is written."""
    from transformers import TrainerCallback

    from aot_transformers.training.lm import parse_lm_arguments, prepare_lm_training, run_lm_training

    class Poison(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kwargs):
            if state.global_step == 3:
                with torch.no_grad():
                    next(model.parameters()).fill_(float("nan"))

    output = tmp_path / "a"
    model_args, data_args, publish_args, lora, optim, training_args = parse_lm_arguments(
        tiny(corpus, output, "--max_steps", "5")[2:]
    )
    prepared = prepare_lm_training(model_args, data_args, training_args, publish_args, callbacks=[Poison()])
    with pytest.raises(Exception, match="diverged at step 3"):
        run_lm_training(prepared)
    assert sorted(p.name for p in output.glob("checkpoint-*")) == ["checkpoint-1", "checkpoint-2"]
    assert not (output / "model").exists()
    assert run(tiny(corpus, output, "--max_steps", "1"), capsys)[0] == 0  # the failed run released its lock


# What a checkpoint and a cached tokenizer were made from.


def test_resuming_another_runs_checkpoint_is_refused(corpus, tmp_path, capsys):
    output = tmp_path / "a"
    assert run(tiny(corpus, output, "--seed", "0"), capsys)[0] == 0
    record = json.loads((output / "checkpoint-2" / RUN_RECORD).read_text())
    assert record["seed"] == 0
    other_seed = tiny(corpus, output, "--seed", "1", "--max_steps", "4", "--resume_from_checkpoint", "auto")
    code, err = run(other_seed, capsys)
    assert code == 2 and "seed: checkpoint 0, this run 1" in err and "--resume_from_checkpoint" in err
    assert not (output / "checkpoint-3").exists()
    code, _ = run(tiny(corpus, output, "--seed", "0", "--max_steps", "3", "--resume_from_checkpoint", "auto"), capsys)
    assert code == 0 and (output / "checkpoint-3").is_dir()  # the same run resumes


def _only_the_tokenizer_left(output: Path) -> None:
    """What a run killed after training its tokenizer and before its first checkpoint leaves (a folder holding another
    run's checkpoints or export is refused to a different run)."""
    import shutil

    for folder in [*output.glob("checkpoint-*"), output / "model"]:
        shutil.rmtree(folder)


def test_cached_tokenizer_is_rebuilt_when_data_or_vocabulary_change(corpus, tmp_path, capsys):
    output = tmp_path / "a"
    assert run(tiny(corpus, output, "--max_steps", "1"), capsys)[0] == 0
    cached = output / "tokenizer" / "tokenizer.json"
    first = json.loads(cached.read_text())
    assert len(first["model"]["vocab"]) == 300
    smaller = tiny(corpus, tmp_path / "unused", "--max_steps", "1")
    smaller[smaller.index("--tokenizer_vocab_size") + 1] = "280"
    smaller[smaller.index("--output_dir") + 1] = str(output)
    _only_the_tokenizer_left(output)
    assert run(smaller, capsys)[0] == 0
    assert len(json.loads(cached.read_text())["model"]["vocab"]) == 280
    other = tmp_path / "other.txt"
    other.write_text(corpus.read_text().replace("alpha", "omega"))
    changed = tiny(other, output, "--max_steps", "1")
    _only_the_tokenizer_left(output)
    assert run(changed, capsys)[0] == 0
    assert "omega" in cached.read_text() and "alpha" not in json.loads(cached.read_text())["model"]["vocab"]


# The output folder itself (argument values are in tests/test_bad_inputs.py).


def test_output_dir_that_is_a_file_is_refused(corpus, tmp_path, capsys):
    path = tmp_path / "file"
    path.write_text("keep")
    code, err = run(tiny(corpus, path), capsys)
    assert code == 2 and "--output_dir" in err and "is a file" in err
    assert path.read_text() == "keep"


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root writes into read-only folders")
def test_read_only_output_dir_is_refused(corpus, tmp_path, capsys):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        code, err = run(tiny(corpus, folder), capsys)
    finally:
        folder.chmod(0o700)
    assert code == 2 and "not writable" in err


def test_unwritable_output_dir_is_refused_even_for_root(corpus, tmp_path, monkeypatch, capsys):
    folder = tmp_path / "ro"
    folder.mkdir()
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: False if Path(path) == folder else real_access(path, mode))
    code, err = run(tiny(corpus, folder), capsys)
    assert code == 2 and "--output_dir" in err and "not writable" in err


# A run refused before its first step leaves no trace: no folder where there was none, a used one byte for byte.


def _null_text(folder: Path) -> Path:
    """A parquet file whose second text is null: refused as it is tokenized, after the run took its output folder."""
    import datasets

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "null.parquet"
    datasets.Dataset.from_dict({"text": ["alpha beta gamma " * 30, None, "delta " * 30]}).to_parquet(str(path))
    return path


def _images_with_one_broken(folder: Path) -> Path:
    """Two classes of tiny images and a file that is no image: refused as the images are read."""
    from PIL import Image

    for label in ("cat", "dog"):
        (folder / label).mkdir(parents=True)
        for i in range(3):
            Image.new("RGB", (8, 8), (40 * i, 0, 0)).save(folder / label / f"{i}.png")
    (folder / "dog" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n not really")
    return folder


def _image_run(data: Path | str, output: Path, *extra: str) -> list[str]:
    return ["train", "image", "--dataset_name", str(data), "--output_dir", str(output), "--use_cpu", "--report_to",
            "none", "--max_steps", "1", *extra]  # fmt: skip


def _char_tokenizer(folder: Path) -> str:
    from support import char_tokenizer

    char_tokenizer().save_pretrained(folder)  # 98 tokens
    return str(folder)


SMALL_VOCABULARY = "hidden_size=32,num_hidden_layers=1,num_attention_heads=2,vocab_size=64"
REFUSED_BEFORE_TRAINING = [
    "lm: a null text",
    "lm: a tokenizer larger than the model's vocabulary",
    "lm: a tokenizer to train larger than the model's vocabulary",
    "lm: a misspelt config override",
    "image: a file that is no image",
    "image: a misspelt config override",
]


def _refused_run(case: str, corpus: Path, scratch: Path, output: Path) -> tuple[list[str], str]:
    """The command of a `REFUSED_BEFORE_TRAINING` case into `output` (its data made in `scratch`), and a needle of
    its error line."""
    if case == "lm: a null text":
        return tiny(_null_text(scratch), output), "null.parquet, row 1"
    if case == "lm: a tokenizer larger than the model's vocabulary":
        tokenizer = ["--tokenizer_name_or_path", _char_tokenizer(scratch / "chars")]
        argv = tiny(corpus, output, *tokenizer, "--config_overrides", SMALL_VOCABULARY)
        return argv, "The tokenizer has 98 tokens but the model's vocab_size is 64"
    if case == "lm: a tokenizer to train larger than the model's vocabulary":
        argv = tiny(corpus, output, "--config_overrides", SMALL_VOCABULARY)
        return argv, "--tokenizer_vocab_size 300 is larger than the model's vocab_size 64"
    if case == "lm: a misspelt config override":
        return tiny(corpus, output, "--config_overrides", "hiden_size=32"), "did you mean 'hidden_size'"
    if case == "image: a file that is no image":
        return _image_run(_images_with_one_broken(scratch / "images"), output), "broken.png"
    assert case == "image: a misspelt config override"
    return _image_run("sklearn-digits", output, "--config_overrides", "hiden_size=32"), "did you mean 'hidden_size'"


@pytest.mark.parametrize("case", REFUSED_BEFORE_TRAINING)
def test_a_run_refused_before_training_leaves_no_output_folder(corpus, tmp_path, capsys, case):
    output = tmp_path / "runs" / "a"  # neither folder is there yet
    argv, needle = _refused_run(case, corpus, tmp_path, output)
    code, err = run(argv, capsys)
    errors = [line for line in err.splitlines() if ": error: " in line]
    assert code == 2 and len(errors) == 1 and needle in errors[0] and "Traceback" not in err, err
    assert not (tmp_path / "runs").exists()


def _contents(folder: Path) -> dict[str, bytes | None]:
    """Every file's bytes and every folder (None) under `folder`, the lock file included."""
    return {p.relative_to(folder).as_posix(): None if p.is_dir() else p.read_bytes() for p in folder.rglob("*")}


def test_a_run_refused_before_training_leaves_a_used_output_folder_byte_for_byte(corpus, tmp_path, capsys):
    output = tmp_path / "a"
    assert run(tiny(corpus, output, "--max_steps", "1"), capsys)[0] == 0
    (output / "notes.txt").write_text("the user's own")
    before = _contents(output)
    assert "checkpoint-1/model.safetensors" in before and LOCK_FILE in before and RUN_RECORD in before
    for case in REFUSED_BEFORE_TRAINING:
        if case.startswith("lm:"):  # other data or another model: refused, at the latest as a different run's
            argv, _ = _refused_run(case, corpus, tmp_path / case.replace(" ", "-"), output)
            code, err = run(argv, capsys)
            assert code == 2 and err.count("error:") == 1, (case, err)
            assert _contents(output) == before, case
    # A folder holding no run's work (another run's record, a user's file) is taken, then given back as it was.
    for folder in [*output.glob("checkpoint-*"), output / "model", output / "tokenizer"]:
        shutil.rmtree(folder)
    (output / RUN_RECORD).write_text('{"seed": 99}\n')
    before = _contents(output)
    code, err = run(tiny(_null_text(tmp_path / "null"), output), capsys)
    assert code == 2 and "null.parquet, row 1" in err
    assert _contents(output) == before  # the record it rewrote restored, the tokenizer it trained removed


# Markers a kill or a power loss can break.


def test_checkpoint_with_a_truncated_trainer_state_counts_as_absent(corpus, tmp_path, capsys):
    output = tmp_path / "a"
    assert run(tiny(corpus, output), capsys)[0] == 0
    (output / "checkpoint-2" / "trainer_state.json").write_text("")  # 0 bytes, as after a power loss
    assert last_complete_checkpoint(output).endswith("checkpoint-1")
    (output / "checkpoint-1" / "trainer_state.json").write_text('{"global_step": 1, "log_hi')  # truncated
    assert last_complete_checkpoint(output) is None
    code, _ = run(tiny(corpus, output, "--resume_from_checkpoint", "auto"), capsys)
    assert code == 0  # starts fresh instead of failing for good


def test_truncated_cached_tokenizer_is_rebuilt(corpus, tmp_path, capsys):
    output = tmp_path / "a"
    assert run(tiny(corpus, output, "--max_steps", "1"), capsys)[0] == 0
    cached = output / "tokenizer" / "tokenizer.json"
    cached.write_text(cached.read_text()[:100])
    assert run(tiny(corpus, output, "--max_steps", "1"), capsys)[0] == 0
    assert json.loads(cached.read_text())["model"]["vocab"]


# Extra files, staging folders of killed exports, re-running a finished job.


@pytest.mark.parametrize("name", ["../escaped.txt", "/tmp/aot-absolute.txt", "sub/../../up.txt"])
def test_extra_files_cannot_leave_the_export(tmp_path, name):
    model = AoTForCausalLM(AoTConfig.from_preset("aot-mssa-l-tiny", hidden_size=32, num_hidden_layers=1))
    with pytest.raises(UsageError, match="outside the export"):
        export_model(model, tmp_path / "export", extra_files={name: "x"})
    assert not (tmp_path / "escaped.txt").exists() and not (tmp_path / "export").exists()
    assert not Path("/tmp/aot-absolute.txt").exists()


def test_staging_folders_of_killed_exports_are_removed_and_live_ones_kept(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / ".export.abc123"
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"half")
    (stale / STAGING_MARKER).write_text(json.dumps({"pid": int(dead.stdout), "host": os.uname().nodename}))
    alive = tmp_path / ".export.def456"  # another process still writing: left alone
    alive.mkdir()
    (alive / STAGING_MARKER).write_text(json.dumps({"pid": os.getpid(), "host": os.uname().nodename}))
    model = AoTForCausalLM(AoTConfig.from_preset("aot-mssa-l-tiny", hidden_size=32, num_hidden_layers=1))
    export_model(model, tmp_path / "export")
    assert not stale.exists() and alive.exists()


def test_rerunning_a_finished_job_trains_no_further(corpus, tmp_path, capsys):
    output = tmp_path / "a"
    assert run(tiny(corpus, output), capsys)[0] == 0
    assert run(tiny(corpus, output, "--resume_from_checkpoint", "auto"), capsys)[0] == 0
    assert sorted(p.name for p in output.glob("checkpoint-*")) == ["checkpoint-1", "checkpoint-2"]
    card = (output / "model" / "README.md").read_text()
    results = json.loads((output / "model" / "results.json").read_text())
    assert results["settings"]["steps"] == 2 and results["metrics"]["train_steps_this_run"] == 0
    assert "| steps | 2 |" in card
    # The card's epochs and tokens are the run's own: 2 steps of 4 blocks of 32 tokens (a short run's epochs, not 0).
    epochs = float(card.split("| epochs | ", 1)[1].split(" |", 1)[0])
    assert 0 < epochs == results["settings"]["epochs"] < 1 and "| training tokens | 256 |" in card


# A second run into a used folder, a kill between two files of one checkpoint, killed writers' temporaries.


def _fingerprints(folder: Path) -> dict[str, tuple[int, int]]:
    return {
        p.relative_to(folder).as_posix(): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in folder.rglob("*")
        if p.is_file() and p.name != LOCK_FILE
    }


def test_a_different_run_into_a_used_output_dir_is_refused_and_the_same_run_resumes(corpus, tmp_path, capsys):
    output = tmp_path / "a"
    assert run(tiny(corpus, output, "--seed", "0"), capsys)[0] == 0
    before = _fingerprints(output)
    assert "model/model.safetensors" in before and "checkpoint-2/aot_run.json" in before
    code, err = run(tiny(corpus, output, "--seed", "1"), capsys)  # no resume flag: it would start over and replace
    assert code == 2 and err.count("error:") == 1 and len(err.strip().splitlines()) == 1
    assert "--output_dir" in err and str(output) in err and "seed: recorded 0, this run 1" in err
    assert "--resume_from_checkpoint latest" in err and "another --output_dir" in err
    assert _fingerprints(output) == before  # nothing written, nothing replaced
    code, _ = run(
        tiny(corpus, output, "--seed", "0", "--max_steps", "3", "--resume_from_checkpoint", "latest"), capsys
    )
    assert code == 0 and (output / "checkpoint-3" / RUN_RECORD).is_file()  # the same run resumes as before
    assert json.loads((output / "checkpoint-3" / "trainer_state.json").read_text())["global_step"] == 3


def test_a_used_output_dir_without_any_run_record_is_refused(corpus, tmp_path, capsys):
    output = tmp_path / "a"
    assert run(tiny(corpus, output, "--max_steps", "1"), capsys)[0] == 0
    for record in output.rglob(RUN_RECORD):  # as an older aot-transformers or another tool leaves it
        record.unlink()
    before = _fingerprints(output)
    code, err = run(tiny(corpus, output, "--max_steps", "1"), capsys)
    assert code == 2 and "--output_dir" in err and f"no {RUN_RECORD}" in err and _fingerprints(output) == before


def test_a_kill_between_a_checkpoints_weights_and_its_record_leaves_it_incomplete(corpus, tmp_path, capsys):
    """Kill the run (SIGKILL: no cleanup) while it writes checkpoint-2's record: the weights are there, the record
    only as a temporary file, and `trainer_state.json` (written after the record) not at all. The next run resumes
    from checkpoint-1 and leaves no temporary file behind; a checkpoint whose record is missing is never resumed."""
    output = tmp_path / "a"
    script = textwrap.dedent(
        f"""
        import os, signal, sys
        import aot_transformers.evaluation.results as results
        real_replace = os.replace
        def replace(source, target):
            if str(target).endswith("checkpoint-2/{RUN_RECORD}"):
                os.kill(os.getpid(), signal.SIGKILL)
            real_replace(source, target)
        results.os.replace = replace
        from aot_transformers.cli import main
        sys.exit(main({tiny(corpus, output)!r}))
        """
    )
    killed = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert killed.returncode == -9, killed.stderr[-2000:]
    checkpoint = output / "checkpoint-2"
    assert (checkpoint / "model.safetensors").is_file() and not (checkpoint / "trainer_state.json").exists()
    assert list(checkpoint.glob(f".{RUN_RECORD}.*")) and not (checkpoint / RUN_RECORD).exists()
    assert last_complete_checkpoint(output).endswith("checkpoint-1")
    code, err = run(tiny(corpus, output, "--resume_from_checkpoint", "latest"), capsys)
    assert code == 0, err
    assert not list(output.rglob(f".{RUN_RECORD}.*"))  # the killed writer's temporary file is gone
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    assert state["global_step"] == 2 and (checkpoint / RUN_RECORD).is_file()
    # The old order's hole: trainer_state.json present, the record lost. Such a checkpoint is incomplete.
    (checkpoint / RUN_RECORD).unlink()
    assert last_complete_checkpoint(output).endswith("checkpoint-1")
    code, err = run(tiny(corpus, output, "--resume_from_checkpoint", str(checkpoint)), capsys)
    assert code == 2 and "incomplete" in err and RUN_RECORD in err


def test_temporary_files_of_a_killed_results_writer_are_removed_by_the_next_write(tmp_path):

    target = tmp_path / "results.json"
    script = textwrap.dedent(
        f"""
        import os, signal
        import aot_transformers.evaluation.results as results
        results.os.replace = lambda source, target: os.kill(os.getpid(), signal.SIGKILL)
        results.atomic_write_text({str(target)!r}, "{{}}")
        """
    )
    killed = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert len(list(tmp_path.glob(".results.json.*"))) == 1 and not target.exists()
    own = tmp_path / f".results.json.{os.uname().nodename}-{os.getpid()}.live"  # a live writer's: left alone
    own.write_text("")
    atomic_write_text(target, '{"a": 1}')
    assert json.loads(target.read_text()) == {"a": 1}
    assert [p.name for p in tmp_path.glob(".results.json.*")] == [own.name]
