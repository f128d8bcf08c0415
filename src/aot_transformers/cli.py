"""The `aot` command. Subcommands register themselves here; each parses arguments and calls the library, under the
error contract of `aot_transformers.errors`.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Iterator
from typing import NoReturn

from .errors import DEBUG_ENV, EXIT_USAGE, run_command


class OneLineArgumentParser(argparse.ArgumentParser):
    """An `ArgumentParser` whose errors follow the contract: one line naming the command, exit code 2 (argparse's
    default prints the whole usage block first)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def _info(args: argparse.Namespace) -> int:
    from . import __version__
    from .configuration_aot import AoTConfig
    from .presets import PAPER_PARAMETERS, list_presets

    print(f"aot-transformers {__version__}")
    for name in list_presets():
        config = AoTConfig.from_preset(name)
        paper = PAPER_PARAMETERS.get(name)
        note = f"  (paper: {paper[0] / 1e6:.0f}M)" if paper else ""
        print(
            f"  {name:20s} {config.attention_type} {config.num_hidden_layers:>2d} layers x {config.hidden_size:>4d}"
            f" x {config.num_attention_heads:>2d} heads{note}"
        )
    return 0


def _verify(args: argparse.Namespace) -> int:
    from .verify import verify_folder

    report = verify_folder(args.folder)  # a missing folder or unreadable config.json: UsageError, exit 2
    print("\n".join(report.lines()))
    if not report.ok:  # a failed check: exit 1, the reasons on one line too (stdout may go to a file)
        print(f"aot verify: {args.folder} FAILED: {'; '.join(report.problems())}", file=sys.stderr)
    return 0 if report.ok else 1


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of `aot` with every subcommand."""
    parser = OneLineArgumentParser(prog="aot", description="Attention-only transformers for Hugging Face.")
    parser.add_argument(
        "--debug", action="store_true", help="print the traceback of a failed command (sets AOT_DEBUG=1 for workers)"
    )
    subcommands = parser.add_subparsers(dest="command", required=True, parser_class=OneLineArgumentParser)
    info = subcommands.add_parser("info", help="version and presets")
    info.set_defaults(func=_info)
    verify = subcommands.add_parser(
        "verify",
        help="check, before trusting it, that a model folder runs only the installed package's code and has no pickle",
    )
    verify.add_argument("folder", help="a folder written by save_pretrained / aot export, or downloaded")
    verify.set_defaults(func=_verify)
    from .graph_export import register as register_graph_export  # `aot export onnx`
    from .serving import register as register_serve  # `aot serve`: transformers' OpenAI-compatible server

    for register in (register_graph_export, register_serve, *_subcommand_registrars()):
        register(subcommands)
    return parser


def _subcommand_registrars() -> Iterator[Callable[[argparse._SubParsersAction], None]]:
    """`register(subcommands)` of each command group: training (`train`, `push`, `demo`), `eval`, `experiment`."""
    import importlib

    optional = ("datasets", "lm_eval", "matplotlib", "accelerate", "tokenizers", "sklearn")
    for group in ("training", "evaluation", "experiments"):
        module = f"{__package__}.{group}.cli"
        try:
            yield importlib.import_module(module).register
        except ModuleNotFoundError as error:
            # A group that is absent or whose optional dependencies are missing is left out; a bug is not hidden.
            missing = error.name or ""
            if missing not in (module, f"{__package__}.{group}") and missing.split(".")[0] not in optional:
                raise


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `aot` console script: parse, then run the subcommand under the error contract."""
    args = build_parser().parse_args(argv)  # --help exits 0; a bad option: one line, SystemExit(2)
    if vars(args).pop("debug", False):  # popped: subcommands pass their namespace on as options
        os.environ[DEBUG_ENV] = "1"  # also reaches processes the command starts
    return run_command(lambda: args.func(args), prog=f"aot {args.command}")


if __name__ == "__main__":
    sys.exit(main())
