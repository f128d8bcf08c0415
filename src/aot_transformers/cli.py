"""The `aot` command. Subcommands register themselves here; each parses arguments and calls the library."""

from __future__ import annotations

import argparse
import sys


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

    report = verify_folder(args.folder)
    print("\n".join(report.lines()))
    return 0 if report.ok else 1


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of `aot` with every subcommand."""
    parser = argparse.ArgumentParser(prog="aot", description="Attention-only transformers for Hugging Face.")
    subcommands = parser.add_subparsers(dest="command", required=True)
    info = subcommands.add_parser("info", help="version and presets")
    info.set_defaults(func=_info)
    verify = subcommands.add_parser("verify", help="check a saved model folder's code files against their hashes")
    verify.add_argument("folder", help="a folder written by save_pretrained / aot export, or downloaded")
    verify.set_defaults(func=_verify)
    from .graph_export import register as register_graph_export  # `aot export onnx`

    register_graph_export(subcommands)
    for register in _subcommand_registrars():
        register(subcommands)
    return parser


def _subcommand_registrars():
    """`register(subcommands)` of each command group: training (`train`, `push`, `demo`), `eval`, `experiment`."""
    import importlib

    optional = ("datasets", "evaluate", "lm_eval", "matplotlib", "accelerate", "tokenizers", "sklearn")
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
    """Entry point of the `aot` console script."""
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
