"""`aot experiment NAME [--out DIR] [options]` and `aot inspect MODEL`: thin argument parsing over the study modules.

Each study's options are read from its module's `OPTIONS` (declared once, next to the code); options left out keep
their declared defaults (argparse.SUPPRESS). Bad options are a one-line error with exit code 2.
"""

from __future__ import annotations

import argparse
from pathlib import Path

S = argparse.SUPPRESS

# One line of help per study; each study's options are its module's `OPTIONS` (declared once, next to its code).
_HELP = {
    "denoising": "AoT Theorem 1 / Fig. 4: SNR per layer of unrolled MSSA",
    "icl": "AoT Fig. 6: in-context linear / sparse regression",
    "clustering": "attention-based clustering: Figs 1-15 and the closed forms",
    "knn": "KVT: noise distillation and training speed of k-NN attention",
    "knn-evidence": "KVT: slow vs fast definition, Lemmas 1 and 3, Figs 1-4 (k sweep, diagnostics, maps)",
    "attention-maps": "AoT Fig. 7: [CLS]-to-patch attention of each head (penultimate layer)",
}


class _OneLineErrorParser(argparse.ArgumentParser):
    """A parser whose errors are one line on stderr and exit code 2 (no usage block, no traceback)."""

    def error(self, message: str):  # noqa: D102 - argparse's hook
        self.exit(2, f"{self.prog}: error: {message}\n")


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default=S, help="output folder (default: out/experiments/NAME)")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads (default 1: the studies' tensors are small, and one thread is "
        "fastest on a shared CPU)",
    )


def _study_module(name: str):
    import importlib

    from . import STUDIES

    return importlib.import_module(f"{__package__}.{STUDIES[name]}")


def study_options(args: argparse.Namespace) -> dict:
    """The study's own options (and `out`) from a parsed `aot experiment NAME ...`, without the command's plumbing."""
    plumbing = ("command", "study", "func", "threads", "debug")
    return {key: value for key, value in vars(args).items() if key not in plumbing}


def _run_experiment(args: argparse.Namespace) -> int:
    import sys

    import torch

    from ..errors import UsageError
    from ._common import require_matplotlib, resolve_options

    options = study_options(args)
    module = _study_module(args.study)
    prog = f"aot experiment {args.study}"
    try:
        require_matplotlib(prog)
        if args.threads < 1:
            raise ValueError(f"`threads` must be an int >= 1, got {args.threads}.")
        resolve_options(module.OPTIONS, {k: v for k, v in options.items() if k != "out"})
        torch.set_num_threads(args.threads)
        results = module.run(**options)
    except (UsageError, ValueError, FileNotFoundError) as error:
        # A bad option (or a missing data folder) is the user's to fix: one line and exit code 2, as argparse does.
        print(f"{prog}: error: {error}", file=sys.stderr)
        return 2
    _print_claims(results, options.get("out") or Path("out") / "experiments" / args.study)
    return 0


def _run_inspect(args: argparse.Namespace) -> int:
    import torch

    from ..errors import UsageError
    from ._common import require_matplotlib
    from .diagnostics import run

    require_matplotlib("aot inspect")
    if args.threads < 1:
        raise UsageError("must be at least 1", argument="--threads", value=args.threads)
    torch.set_num_threads(args.threads)
    options = {key: value for key, value in vars(args).items() if key not in ("command", "func", "threads")}
    results = run(**options)
    _print_claims(results, options.get("out") or Path("out") / "experiments" / "inspect")
    return 0


def _knn_k(text: str) -> int | float:
    """`--knn-k`: an integer count of keys (`16`) or a fraction of them (`0.5`), as `AoTConfig.knn_k`."""
    return float(text) if any(c in text for c in ".eE") else int(text)


def _print_claims(results: dict, folder) -> None:
    for claim in results.get("claims", []):
        verdict = {True: "ok", False: "MISMATCH", None: "-"}[claim["holds"]]
        print(f"[{verdict:8s}] {claim['quantity']}: {claim['measured']}  (paper: {claim['paper']})")
    print(f"results.json, figures and summary.md in {folder}")


def register(subcommands: argparse._SubParsersAction) -> None:
    """Add `experiment` (one sub-command per study) and `inspect` to the `aot` command."""
    experiment = subcommands.add_parser(
        "experiment",
        help="run one of the papers' studies (results.json, PNGs, summary.md)",
        description="Reproduce a proposition or figure of the papers on this machine.",
    )
    studies = experiment.add_subparsers(dest="study", required=True, metavar="NAME", parser_class=_OneLineErrorParser)
    for name, help_text in _HELP.items():
        module = _study_module(name)
        parser = studies.add_parser(name, help=help_text, description=(module.__doc__ or "").split("\n")[0])
        _common(parser)
        for option in module.OPTIONS:
            option.add_to(parser)
    experiment.set_defaults(func=_run_experiment)

    inspect = subcommands.add_parser(
        "inspect",
        help="layer-wise coding rate and head subspace energy of a model",
        description="Per layer, the coding rate of the token representations and each head's subspace energy.",
    )
    inspect.add_argument("model", help="saved AoT folder, or a preset name (random weights)")
    inspect.add_argument("--out", default=S)
    inspect.add_argument("--data", default=S, help="text file for language models")
    inspect.add_argument("--num-samples", type=int, default=S)
    inspect.add_argument("--seq-len", type=int, default=S)
    inspect.add_argument("--eps", type=float, default=S)
    inspect.add_argument(
        "--knn-k",
        type=_knn_k,
        default=S,
        help="also compare dense and k-NN attention per layer (KVT Fig. 2) at this k",
    )
    inspect.add_argument("--threads", type=int, default=1)
    inspect.set_defaults(func=_run_inspect)
