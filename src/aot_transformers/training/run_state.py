"""What keeps a training run from losing or mixing up files: checked before the first step, guarded during training.

- **The output folder** must be a writable folder, and only one run may use it at a time: the main process holds an
  exclusive lock on `<output_dir>/.aot.lock` for the whole run, so a second run on the same folder stops at once. A
  run refused before its first training step leaves the folder as it found it (`OutputFolderClaim`): no folder
  where there was none, nothing added to one that was there, nothing removed from it.
- **The final folder** (`--final_model_dir`, default `<output_dir>/model`) may only replace an earlier export of this
  package, never the output folder or a parent of it, nor a folder of other files (`hub.check_replaceable`) — checked
  before training, so a long run never dies at its end on a folder it must not touch.
- **Whose folder it is**: `<output_dir>/RUN_RECORD` names the run that writes there (seed, data, model config, the
  run's own settings). A different run into a folder that holds another run's checkpoints or final export is refused
  before it writes anything; the same run resumes (or starts over) as before.
- **Which checkpoint to resume from**: the newest complete one (`--resume_from_checkpoint latest`); one a kill
  interrupted mid-write is skipped.
- **What a checkpoint was made from** (`RUN_RECORD` in every checkpoint, written right after its weights and before
  Trainer's `trainer_state.json` marks it complete) is compared with the run that resumes from it: a mismatch is
  refused, naming the fields; a checkpoint without its record is incomplete and never resumed.
- **A SIGTERM** (a preemption, a session's end) with `--enable_jit_checkpoint`: transformers saves the step under way
  and stops; the run then ends as interrupted (exit code 130, the checkpoint named, no final export), and the same
  command with `--resume_from_checkpoint latest` continues from that step.
- **Divergence**: after every optimizer step the weights are checked; non-finite ones stop the run (exit code 1)
  before that step's checkpoint or any export is written, so the last checkpoint on disk is a good one.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
import shutil
import signal
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from .._io import (
    LOCK_FILE,
    FolderLockedError,
    atomic_write_text,
    lock_folder,
    read_json,
    remove_stale_temporaries,
    writable_folder,
    write_json,
)
from ..errors import RunError, UsageError
from .arguments import PublishArguments, TrainingSetupError, check_training_arguments

if TYPE_CHECKING:
    import torch
    from filelock import BaseFileLock
    from transformers import PreTrainedConfig, Trainer, TrainerControl, TrainerState, TrainingArguments

logger = logging.getLogger(__name__)

RUN_RECORD = "aot_run.json"
# Config fields that change between runs of the same model without changing the model.
_VOLATILE_CONFIG_FIELDS = set(
    "_attn_implementation _attn_implementation_internal _name_or_path architectures auto_map code_sha256 dtype "
    "required_transformers torch_dtype transformers_version use_cache".split()
)
JIT_SENTINEL = "checkpoint-is-incomplete.txt"  # transformers' JIT checkpoint marks its folder so until it is written
CHECKPOINT_PATTERN = re.compile(r"^checkpoint-(\d+)$")
RESUME_LATEST = ("latest", "last", "true", "True", "auto")
_SAMPLE_BYTES = 1 << 20  # a data file is fingerprinted by its size and its first and last MiB


def is_complete_checkpoint(folder: Path) -> bool:
    """Trainer writes `trainer_state.json` last: a checkpoint without it, or with an empty or truncated one (a power
    loss before the file reached the disk), was interrupted while being written; so was one without its readable
    `RUN_RECORD` (written before `trainer_state.json`). The weights are one `*.safetensors` file (or shards) or,
    under FSDP with a sharded state dict, a `pytorch_model_fsdp_0` folder of distributed-checkpoint shards."""
    for name in ("trainer_state.json", RUN_RECORD):
        if not isinstance(read_json(Path(folder) / name), dict):
            return False
    if (Path(folder) / JIT_SENTINEL).exists():  # a SIGTERM's checkpoint that did not finish
        return False
    return any(folder.glob("*.safetensors")) or any(folder.glob("pytorch_model_fsdp_*"))


def last_complete_checkpoint(output_dir: str | os.PathLike) -> str | None:
    """The newest complete `checkpoint-N` folder of a run, skipping one a kill interrupted mid-write."""
    root = Path(output_dir)
    if not root.is_dir():
        return None
    found = sorted(
        (int(match.group(1)), path)
        for path in root.iterdir()
        if path.is_dir() and (match := CHECKPOINT_PATTERN.match(path.name))
    )
    for _step, path in reversed(found):
        if is_complete_checkpoint(path):
            return str(path)
        logger.warning("Skipping incomplete checkpoint %s (interrupted while being written).", path)
    return None


def resolve_resume(resume_from_checkpoint: str | None, output_dir: str | None) -> str | None:
    """`--resume_from_checkpoint`: a checkpoint folder, or `latest`/`true`/`auto` for the newest complete one in
    `output_dir` (`auto` starts fresh when there is none). Raises `TrainingSetupError` for a missing checkpoint."""
    if resume_from_checkpoint in (None, "", "false", "False", "no"):
        return None
    if resume_from_checkpoint in RESUME_LATEST:
        found = last_complete_checkpoint(output_dir) if output_dir else None
        if found is None and resume_from_checkpoint != "auto":
            raise TrainingSetupError(
                f"no checkpoint in {output_dir} (use `auto` to start fresh when there is none)",
                argument="--resume_from_checkpoint",
                value=resume_from_checkpoint,
            )
        return found
    path = Path(resume_from_checkpoint)
    if not path.is_dir():
        raise TrainingSetupError("no such folder", argument="--resume_from_checkpoint", value=resume_from_checkpoint)
    if not is_complete_checkpoint(path):
        raise TrainingSetupError(
            f"--resume_from_checkpoint {resume_from_checkpoint} is incomplete (no readable trainer_state.json or "
            f"{RUN_RECORD}: it was interrupted while being written); use an earlier checkpoint or `latest`."
        )
    return str(path)


def file_fingerprint(path: Path) -> str:
    """Size plus a hash of the first and last MiB: cheap for a corpus of any size, and blind to a mere `touch`."""
    size = path.stat().st_size
    digest = hashlib.sha256(str(size).encode())
    with open(path, "rb") as handle:
        digest.update(handle.read(_SAMPLE_BYTES))
        if size > _SAMPLE_BYTES:
            handle.seek(max(_SAMPLE_BYTES, size - _SAMPLE_BYTES))
            digest.update(handle.read(_SAMPLE_BYTES))
    return f"{size}:{digest.hexdigest()[:16]}"


def data_fingerprint(*sources: str | list[str] | None) -> list[str]:
    """What the data arguments point at: for a local file its fingerprint, for a folder those of its files, for a
    Hub id the id itself."""
    found = []
    for source in sources:
        for item in [source] if isinstance(source, str) else source or []:
            path = Path(item).expanduser()
            if path.is_file():
                found.append(f"{path.name}={file_fingerprint(path)}")
            elif path.is_dir():
                files = sorted(p for p in path.rglob("*") if p.is_file())
                total = hashlib.sha256()
                for file in files:
                    total.update(f"{file.relative_to(path)}={file.stat().st_size};".encode())
                found.append(f"{path.name}/:{len(files)} files:{total.hexdigest()[:16]}")
            else:
                found.append(str(item))
    return found


def config_fingerprint(config: PreTrainedConfig) -> str:
    """A hash of the fields that define the model (not those that vary between loads, such as the backend)."""
    fields = {k: v for k, v in config.to_dict().items() if k not in _VOLATILE_CONFIG_FIELDS}
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()[:16]


def run_identity(
    training_args: TrainingArguments, config: PreTrainedConfig, data: list[str], **settings: Any
) -> dict[str, Any]:
    """What a checkpoint of this run is made from: compared field by field when a run resumes from it."""
    return {"seed": training_args.seed, "data": data, "model config": config_fingerprint(config), **settings}


def _differences(recorded: dict[str, Any], identity: dict[str, Any], label: str) -> str:
    """`field: <label> value, this run value; …` for every field in which `recorded` and `identity` differ ('' if
    none)."""
    current = json.loads(json.dumps(identity, default=str))  # as the record reads back
    differ = sorted(k for k in set(recorded) | set(current) if recorded.get(k) != current.get(k))
    return "; ".join(f"{k}: {label} {recorded.get(k)!r}, this run {current.get(k)!r}" for k in differ)


def check_resume_identity(resume: str | None, identity: dict[str, Any]) -> None:
    """Refuse to resume from a checkpoint that another run made (`RUN_RECORD` differs in any field). A checkpoint
    without a readable record never gets here: `resolve_resume` refuses it as incomplete."""
    if resume is None:
        return
    shown = _differences(read_json(Path(resume) / RUN_RECORD) or {}, identity, "checkpoint")
    if shown:
        raise TrainingSetupError(
            f"{resume} was made by a different run ({shown}). Resume with the same settings, start a new run in "
            "another --output_dir, or pass --resume_from_checkpoint false",
            argument="--resume_from_checkpoint",
            value=resume,
        )


class OutputFolderClaim:
    """The output folder as a run found it, so that the run, refused before its first training step, can leave it so
    (`undo`): a folder it created goes, with the parents it created; from a folder that was there, what the run added
    at its top goes (the lock file, the run record, a trained tokenizer) and a run record it rewrote gets its bytes
    back. Nothing that was there before is removed.

    Made before the folder is created and completed once its lock is held (`locked`): a folder that another process
    filled in between is then one that was there. `keep()` (at the end of the first training step) makes `undo` a
    no-op.
    """

    def __init__(self, output_dir: str | os.PathLike):
        self.folder = Path(output_dir).absolute()
        missing = [p for p in (self.folder, *self.folder.parents) if not p.exists()]
        self.created: Path | None = missing[-1] if missing else None  # the topmost folder this run creates
        self.entries: set[str] = set(os.listdir(self.folder)) if self.folder.is_dir() else set()
        self.record = None if missing else _text_or_none(self.folder / RUN_RECORD)
        self.kept = False

    def locked(self) -> None:
        """The lock is held: the folders this run created must hold nothing but the run's (the next folder down, the
        lock file); one that does counts as found from there on, with what it holds then."""
        if self.created is None:
            return
        top = current = self.created
        for part in self.folder.relative_to(self.created).parts:
            if set(os.listdir(current)) != {part}:  # another process wrote here too: removable only below
                top = current / part
            current = current / part
        found = set(os.listdir(self.folder)) - {LOCK_FILE}
        if found:
            self.created, self.entries, self.record = None, found, _text_or_none(self.folder / RUN_RECORD)
        else:
            self.created = top

    def keep(self) -> None:
        """Training has begun: what the run wrote is its own from now on."""
        self.kept = True

    def undo(self) -> None:
        """Leave the folder as the run found it (call it holding the lock); a no-op once `keep` was called."""
        if self.kept:
            return
        self.kept = True  # once
        if self.created is not None:
            shutil.rmtree(self.created, ignore_errors=True)
            return
        for name in sorted(set(os.listdir(self.folder)) - self.entries) if self.folder.is_dir() else []:
            path = self.folder / name
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() and not path.is_symlink() else path.unlink()
        if self.record is not None and _text_or_none(self.folder / RUN_RECORD) != self.record:
            atomic_write_text(self.folder / RUN_RECORD, self.record)


def _text_or_none(path: Path) -> str | None:
    """The UTF-8 text of the file `path`, or None (no such file, or not UTF-8: unreadable as a record anyway)."""
    try:
        return path.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def claim_output_dir(output_dir: str | os.PathLike, identity: dict[str, Any], write: bool = True) -> None:
    """Refuse, before anything is written, a run into a folder that holds the checkpoints or final export
    (`<output_dir>/model`) of a different run (as its own and its checkpoints' `RUN_RECORD` name it), or of no recorded
    run at all (an older aot-transformers, another tool); then (with `write`, the main process) record this run in
    `<output_dir>/RUN_RECORD`. Stale temporary files of a killed record write are removed."""
    root = Path(output_dir)
    checkpoints = sorted(p for p in root.glob("checkpoint-*") if p.is_dir() and CHECKPOINT_PATTERN.match(p.name))
    export = root / "model"
    work = [f"{len(checkpoints)} checkpoint(s)"] if checkpoints else []
    if export.is_dir() and any(export.iterdir()):
        work.append(f"a final export ({export.name}/)")
    records = [(root, read_json(root / RUN_RECORD))] + [(c, read_json(c / RUN_RECORD)) for c in checkpoints]
    records = [(where, record) for where, record in records if isinstance(record, dict)]
    if work:
        held = " and ".join(work)
        if not records:
            raise TrainingSetupError(
                f"holds {held} with no {RUN_RECORD} (an older aot-transformers or another tool): nothing says they "
                f"are this run's, and this run would replace them. Choose another --output_dir or move them away",
                argument="--output_dir",
                value=str(output_dir),
            )
        for where, record in records:
            shown = _differences(record, identity, "recorded")
            if shown:
                raise TrainingSetupError(
                    f"holds {held} of a different run ({where.name}/{RUN_RECORD}: {shown}); this run would replace "
                    "them. Resume that run with its settings (--resume_from_checkpoint latest) or choose another "
                    "--output_dir",
                    argument="--output_dir",
                    value=str(output_dir),
                )
    for folder in [root, *checkpoints]:
        remove_stale_temporaries(folder / RUN_RECORD)
    if write and read_json(root / RUN_RECORD) != json.loads(json.dumps(identity)):  # an equal one is kept as it is
        write_json(root / RUN_RECORD, identity)


class RecordRunTrainerMixin:
    """Put before `transformers.Trainer` in a subclass: every checkpoint gets `RUN_RECORD` (the `run_record`
    attribute) right after its weights and before `trainer_state.json`, the file that marks it complete, so a kill
    between the two never leaves a complete-looking checkpoint without its record.

    It also loads a checkpoint's weights (to resume, or the best one at the end) through `from_pretrained`, which
    renames the keys a model saves under other names than its modules' (transformers' ViT: `vit.encoder.layer.0` for
    `vit.layers.0`); Trainer's plain `load_state_dict(strict=False)` would leave those layers freshly initialised."""

    run_record: dict[str, Any] | None = None

    def _load_by_name(self, folder: str, model: torch.nn.Module) -> bool:
        """Load `folder`'s weights into `model`, every key matched; False (nothing loaded) for a model Trainer's own
        loaders handle: PEFT's, or one sharded by DeepSpeed, FSDP or tensor parallelism."""
        from transformers import PreTrainedModel

        sharded = (
            self.is_deepspeed_enabled
            or self.is_fsdp_enabled
            or any(hasattr(p, "to_local") for p in model.parameters())
        )
        if sharded or not isinstance(model, PreTrainedModel):
            return False
        model.load_state_dict(type(model).from_pretrained(folder).state_dict(), strict=True)
        return True

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: torch.nn.Module | None = None) -> None:
        if not self._load_by_name(resume_from_checkpoint, self.model if model is None else model):
            super()._load_from_checkpoint(resume_from_checkpoint, model)

    def _load_best_model(self) -> None:
        if not self._load_by_name(self.state.best_model_checkpoint, self.model):
            super()._load_best_model()

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        super().save_model(output_dir, _internal_call)
        folder = Path(output_dir or self.args.output_dir)
        if _internal_call and self.run_record is not None and self.args.should_save:
            if CHECKPOINT_PATTERN.match(folder.name):
                write_json(folder / RUN_RECORD, self.run_record)


def run_state_callbacks(claim: OutputFolderClaim | None = None) -> list:
    """The callbacks that stop a diverged run and (with `claim`) keep what the run wrote once its first step is done
    (the checkpoints' records: `RecordRunTrainerMixin`)."""
    import torch
    from transformers import TrainerCallback

    class KeepOutputFolderCallback(TrainerCallback):
        """At the end of the first training step, what the run wrote in its output folder becomes its own."""

        def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs) -> None:
            claim.keep()

    class StopOnNonFiniteCallback(TrainerCallback):
        """After every optimizer step (before that step's logging, saving or evaluation), stop the run if any weight
        is NaN or infinite: nothing diverged is saved or exported. Every rank takes the same decision."""

        def on_step_end(
            self,
            args: TrainingArguments,
            state: TrainerState,
            control: TrainerControl,
            model: torch.nn.Module | None = None,
            **kwargs,
        ) -> None:
            if model is None:
                return
            with torch.no_grad():
                flags = [
                    torch.isfinite(p.to_local() if hasattr(p, "to_local") else p).all()
                    for p in model.parameters()
                    if p.requires_grad
                ]
                bad = (~torch.stack(flags).all()).float() if flags else torch.zeros(())
                if torch.distributed.is_available() and torch.distributed.is_initialized():
                    bad = bad.to(args.device)
                    torch.distributed.all_reduce(bad, op=torch.distributed.ReduceOp.MAX)
            if bad.item() > 0:
                losses = [e["loss"] for e in state.log_history if "loss" in e]
                last = f"; last logged loss {losses[-1]}" if losses else ""
                raise RunError(
                    f"training diverged at step {state.global_step}: the weights became non-finite{last}. Nothing "
                    f"was exported; the checkpoints already in {args.output_dir} are kept. Lower --learning_rate "
                    "or check the data"
                )

        def on_log(
            self,
            args: TrainingArguments,
            state: TrainerState,
            control: TrainerControl,
            logs: dict[str, float] | None = None,
            **kwargs,
        ) -> None:
            loss = (logs or {}).get("loss")
            if isinstance(loss, float) and not math.isfinite(loss):
                raise RunError(
                    f"training diverged at step {state.global_step}: loss {loss}. Nothing was exported; the "
                    f"checkpoints already in {args.output_dir} are kept"
                )

    return [StopOnNonFiniteCallback(), *([KeepOutputFolderCallback()] if claim is not None else [])]


__all__ = [
    "RUN_RECORD",
    "OutputFolderClaim",
    "RecordRunTrainerMixin",
    "check_resume_identity",
    "claim_output_dir",
    "data_fingerprint",
    "is_complete_checkpoint",
    "last_complete_checkpoint",
    "resolve_resume",
    "run_identity",
    "run_state_callbacks",
    "start_run",
    "train_unless_finished",
]


def _save_a_jit_checkpoint_after_the_steps_log(trainer: Trainer) -> None:
    """transformers' JIT checkpoint saves at the first callback after a SIGTERM's grace period. At `on_step_end` that
    is before Trainer logs the step, so the checkpoint's history lacks the step's loss and a resume never logs it.
    Its callback is swapped for one that saves there through Trainer's own path instead, after the log (except under
    `save_strategy="best"`, whose evaluation decides whether Trainer saves)."""
    from transformers.trainer_jit_checkpoint import JITCheckpointCallback

    class SaveAfterTheLogCallback(JITCheckpointCallback):
        def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs) -> None:
            requested = self.jit_manager is not None and self.jit_manager.is_checkpoint_requested
            if not requested or args.save_strategy == "best":
                return super().on_step_end(args, state, control, **kwargs)
            self.jit_manager.is_checkpoint_requested = False
            control.should_save = control.should_training_stop = True

    replacement = SaveAfterTheLogCallback()
    replacement.trainer, replacement.jit_manager = trainer, trainer.pop_callback(JITCheckpointCallback).jit_manager
    trainer.add_callback(replacement)


def train_unless_finished(trainer: Trainer, resume: str | None) -> dict[str, Any]:
    """`trainer.train(resume_from_checkpoint=resume)` and its metrics, except when `resume` already reached the
    run's end (`--max_steps`, or `--num_train_epochs` without it): then its weights and state are loaded and
    nothing is trained, so re-running a finished job re-exports it instead of adding steps past the end."""
    if resume is not None:
        state_file = Path(resume) / "trainer_state.json"
        state = read_json(state_file) or {}
        args = trainer.args
        step, epoch = state.get("global_step", 0), state.get("epoch") or 0.0
        done = step >= args.max_steps if args.max_steps > 0 else epoch >= args.num_train_epochs
        if done:
            from transformers import TrainerState

            logger.warning("%s already reached the end of the run (step %d): nothing more to train.", resume, step)
            trainer._load_from_checkpoint(resume)
            trainer.state = TrainerState.load_from_json(str(state_file))
            return {"train_steps_this_run": 0}
    if not trainer.args.enable_jit_checkpoint:
        return dict(trainer.train(resume_from_checkpoint=resume).metrics)
    _save_a_jit_checkpoint_after_the_steps_log(trainer)
    terminated, jit_handler = [], signal.getsignal(signal.SIGTERM)  # transformers' JIT checkpoint handler

    def note_sigterm(signum: int, frame: FrameType | None) -> None:
        terminated.append(signum)
        jit_handler(signum, frame)

    signal.signal(signal.SIGTERM, note_sigterm)
    try:
        metrics = dict(trainer.train(resume_from_checkpoint=resume).metrics)
    finally:
        signal.signal(signal.SIGTERM, jit_handler)
    if terminated and trainer.state.global_step < trainer.state.max_steps:  # stopped short by the JIT checkpoint
        saved = last_complete_checkpoint(trainer.args.output_dir)
        raise KeyboardInterrupt(
            f"SIGTERM: stopped at step {trainer.state.global_step} of {trainer.state.max_steps}; the newest "
            f"checkpoint is {saved}, from which the same command with --resume_from_checkpoint latest continues"
        )
    return metrics


def start_run(
    training_args: TrainingArguments, publish_args: PublishArguments, identity: dict[str, Any]
) -> tuple[BaseFileLock | None, str | None, OutputFolderClaim | None]:
    """The checks before a run touches anything: a writable output folder, a final folder that may be replaced, the
    output folder's lock, the checkpoint to resume from (`--resume_from_checkpoint`, made by this run) and a folder
    that holds no other run's work (`claim_output_dir`).

    Returns:
        `(lock, resume, claim)`: the held lock (hold it for the whole run; None off the main process), the checkpoint
        to resume from or None, and the `OutputFolderClaim` that undoes the run's writes if it is refused before its
        first step (None off the main process). `training_args.resume_from_checkpoint` is set to the checkpoint.
    """
    from ..hub import check_replaceable

    check_training_arguments(training_args)  # again for runs started from Python, not the command line
    output_dir = training_args.output_dir
    main_process = training_args.process_index == 0
    try:
        check_replaceable(publish_args.final_dir(training_args), protected=(output_dir,))
    except UsageError as error:
        raise TrainingSetupError(str(error).replace("final model folder", "--final_model_dir", 1)) from None
    claim = OutputFolderClaim(output_dir) if main_process else None  # before anything is created
    writable_folder(output_dir, "--output_dir", TrainingSetupError)  # created if needed
    try:  # held by the main process for the whole run (the other ranks of the run share it)
        lock = lock_folder(Path(output_dir) / LOCK_FILE) if main_process else None
    except FolderLockedError as error:  # the folder is another run's: nothing of it is undone
        raise TrainingSetupError(
            f"{error}; wait for it to finish or choose another folder", argument="--output_dir", value=output_dir
        ) from None
    try:
        if claim is not None:
            claim.locked()
        resume = resolve_resume(training_args.resume_from_checkpoint, output_dir)
        check_resume_identity(resume, identity)
        claim_output_dir(output_dir, identity, write=main_process)
    except BaseException:
        if claim is not None:
            claim.undo()
        if lock is not None:
            lock.release()
        raise
    training_args.resume_from_checkpoint = resume
    return lock, resume, claim
