"""The one error contract of every `aot` command.

- **Bad input** (`UsageError` and its subclasses, argparse's own errors, the `ValueError`/`TypeError` with which
  this project's boundaries reject a value — a study option — and a typed config's `StrictDataclassError`): one
  line on stderr naming the argument, the value and what is allowed; exit code 2; nothing already saved is touched.
- **A failed run** (`RunError`, or any other exception): one line on stderr saying what failed; exit code 1. The
  traceback is printed only with `aot --debug …` (or `AOT_DEBUG=1`); otherwise it goes to a log file whose path the
  line names, so an unattended run keeps it without flooding the terminal.
- `KeyboardInterrupt`, and a SIGTERM (raised as one): exit code 130, as a shell reports SIGINT (its message, if any,
  after `interrupted: `).

`run_command(job)` applies the contract to a callable; `aot_transformers.cli.main` applies it to every subcommand,
and the module entry points (`python -m aot_transformers.training.lm`) use it too. Library code raises the classes
below (or subclasses of them) and never calls `sys.exit` itself.
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from huggingface_hub.errors import StrictDataclassError

EXIT_OK = 0
EXIT_RUN_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
DEBUG_ENV = "AOT_DEBUG"


class UsageError(ValueError):
    """Bad input found at the boundary, before anything ran: exit code 2.

    Args:
        message: The whole message, or (with `argument`) what is wrong with the value.
        argument: The command-line argument or field at fault, e.g. `"--lora_r"`.
        value: The value given.
        allowed: What would have been accepted, e.g. `"a positive integer"`.
    """

    def __init__(
        self, message: str = "", *, argument: str | None = None, value: Any = None, allowed: str | None = None
    ):
        if argument is not None:
            head = f"{argument} {value!r}" if value is not None else argument
            message = f"{head}: {message}" if message else head
            if allowed:
                message += f" (allowed: {allowed})"
        super().__init__(message)
        self.argument, self.value, self.allowed = argument, value, allowed


class RunError(RuntimeError):
    """A run that started and then failed (a push refused by the server, a diverged loss, …): exit code 1."""


def is_refusal(error: BaseException) -> bool:
    """Whether `error` refuses bad input (exit code 2) rather than reports a failed run: what a run refused before
    its first step undoes (`aot_transformers.training.run_state.OutputFolderClaim`)."""
    return isinstance(error, (UsageError, ValueError, TypeError, StrictDataclassError))


def debug_enabled() -> bool:
    """Whether tracebacks go to the terminal: `aot --debug` sets `AOT_DEBUG=1` for the command and its workers."""
    return os.environ.get(DEBUG_ENV, "").lower() in ("1", "true", "yes")


def one_line(error: BaseException) -> str:
    """The message of `error` on one line (continuation lines joined), so a log grep finds the whole of it."""
    text = " ".join(line.strip() for line in str(error).splitlines() if line.strip())
    return text or type(error).__name__


def _write_traceback(error: BaseException) -> Path | None:
    """Save the traceback of `error` to a log file (`AOT_LOG_DIR` or the temporary folder); its path or None."""
    folder = Path(os.environ.get("AOT_LOG_DIR") or tempfile.gettempdir())
    try:
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"aot-error-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
        path.write_text("".join(traceback.format_exception(error)), encoding="utf-8")
        return path
    except OSError:  # an unwritable log folder must not hide the error itself
        return None


def report_error(error: BaseException, prog: str = "aot") -> int:
    """Print `error` as the contract says and return its exit code. An error raised while an interrupt unwound (as
    `datasets`' pool cleanup raises a TimeoutError) is reported as that interrupt."""
    context, seen = error, set()
    while context is not None and id(context) not in seen and not isinstance(context, KeyboardInterrupt):
        seen.add(id(context))
        context = context.__context__
    if isinstance(context, KeyboardInterrupt):
        print(f"{prog}: interrupted" + (f": {context}" if str(context) else ""), file=sys.stderr)
        return EXIT_INTERRUPTED
    if debug_enabled():
        traceback.print_exception(error)
    if is_refusal(error):
        print(f"{prog}: error: {one_line(error)}", file=sys.stderr)
        return EXIT_USAGE
    message = one_line(error) if isinstance(error, RunError) else f"{type(error).__name__}: {one_line(error)}"
    if not debug_enabled():
        log = _write_traceback(error)
        where = f"; traceback in {log}" if log else ""
        message += f" (run with --debug for the traceback{where})"
    print(f"{prog}: error: {message}", file=sys.stderr)
    return EXIT_RUN_FAILED


def run_command(job: Callable[[], int | None], prog: str = "aot") -> int:
    """Run `job` under the contract: its return value (None = 0) or the exit code of the error it raised.

    A SIGTERM raises `KeyboardInterrupt("SIGTERM")` in `job` as Ctrl-C would, so the contexts it is in close on the
    way out (a pool of tokenizer processes is terminated, a scratch folder removed) instead of the process dying and
    leaving them behind. A handler `job` sets (Trainer's checkpoint on SIGTERM) takes over while it is set; a process
    forked inside (a pool worker) ends on SIGTERM as by default."""
    owner = os.getpid()

    def interrupt(signum: int, frame: Any) -> None:
        if os.getpid() == owner:
            raise KeyboardInterrupt("SIGTERM")
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        status = job()
    except SystemExit:  # `--help` and argparse's own one-line errors keep their codes
        raise
    except BaseException as error:  # noqa: B036 - the contract covers every failure, KeyboardInterrupt included
        return report_error(error, prog)
    finally:
        signal.signal(signal.SIGTERM, previous)
    return EXIT_OK if status is None else int(status)


__all__ = [
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_RUN_FAILED",
    "EXIT_USAGE",
    "RunError",
    "UsageError",
    "debug_enabled",
    "is_refusal",
    "report_error",
    "run_command",
]
