"""`aot experiment NAME [--out DIR] [options]` and `aot inspect MODEL`: thin argument parsing over the study modules.

Each study's options are its module's `Options` dataclass (declared once, next to the code), turned into flags by
`HfArgumentParser` (`--num-layers` and `--num_layers` alike). Bad options are a one-line error with exit code 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    from transformers import HfArgumentParser

S = argparse.SUPPRESS


def _study_parser(**kwargs: Any) -> HfArgumentParser:
    """A study's parser: its `Options` as flags (`HfArgumentParser`); errors are one line and exit code 2."""
    from transformers import HfArgumentParser

    class StudyParser(HfArgumentParser):
        def error(self, message: str) -> NoReturn:  # argparse's hook: no usage block, no traceback
            self.exit(2, f"{self.prog}: error: {message}\n")

    return StudyParser(**kwargs)


def study_options(args: argparse.Namespace) -> dict:
    """The study's own options (and `out`) from a parsed `aot experiment NAME ...`, without the command's plumbing."""
    plumbing = ("command", "study", "func", "threads", "debug")
    return {key: value for key, value in vars(args).items() if key not in plumbing}


def _run(prog: str, args: argparse.Namespace, run: Callable[..., dict[str, Any]], options: dict, name: str) -> int:
    """Check matplotlib and `--threads`, call `run(**options)`, print its claims and where its files are."""
    import importlib.util

    import torch

    from ..errors import UsageError
    from .study import DEFAULT_OUTPUT_ROOT

    if importlib.util.find_spec("matplotlib") is None:  # every study writes figures: say so before any work
        raise UsageError(
            f"{prog} draws its figures with matplotlib, which is not installed: "
            "pip install 'aot-transformers[experiments]'"
        )
    if args.threads < 1:
        raise UsageError("must be at least 1", argument="--threads", value=args.threads)
    torch.set_num_threads(args.threads)
    results = run(**options)
    for claim in results.get("claims", []):
        verdict = {True: "ok", False: "MISMATCH", None: "-"}[claim["holds"]]
        print(f"[{verdict:8s}] {claim['quantity']}: {claim['measured']}  (paper: {claim['paper']})")
    print(f"results.json, figures and summary.md in {options.get('out') or DEFAULT_OUTPUT_ROOT / name}")
    return 0


def _run_experiment(args: argparse.Namespace) -> int:
    from ..errors import UsageError
    from . import study_module

    prog = f"aot experiment {args.study}"
    try:
        return _run(prog, args, study_module(args.study).run, study_options(args), args.study)
    except (UsageError, ValueError, FileNotFoundError) as error:
        # A bad option (or a missing data folder) is the user's to fix: one line and exit code 2, as argparse does.
        print(f"{prog}: error: {error}", file=sys.stderr)
        return 2


def _run_inspect(args: argparse.Namespace) -> int:
    from .diagnostics import run

    return _run("aot inspect", args, run, study_options(args), "inspect")


def _knn_k(text: str) -> int | float:
    """`--knn-k`: an integer count of keys (`16`) or a fraction of them (`0.5`), as `AoTConfig.knn_k`."""
    return float(text) if any(c in text for c in ".eE") else int(text)


def register(subcommands: argparse._SubParsersAction) -> None:
    """Add `experiment` (one sub-command per study) and `inspect` to the `aot` command."""
    experiment = subcommands.add_parser(
        "experiment",
        help="run one of the papers' studies (results.json, PNGs, summary.md)",
        description="Reproduce a proposition or figure of the papers on this machine.",
    )
    from . import STUDIES, study_module

    studies = experiment.add_subparsers(dest="study", required=True, metavar="NAME", parser_class=_study_parser)
    for name, (_, help_text) in STUDIES.items():
        module = study_module(name)
        description = (module.__doc__ or "").split("\n")[0]
        parser = studies.add_parser(name, help=help_text, description=description, dataclass_types=module.Options)
        parser.add_argument("--out", default=S, help="output folder (default: out/experiments/NAME)")
        parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (1 is fastest on a shared CPU)")
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
    inspect.add_argument("--knn-k", type=_knn_k, default=S, help="also compare k-NN attention at this k (KVT Fig. 2)")
    inspect.add_argument("--threads", type=int, default=1)
    inspect.set_defaults(func=_run_inspect)
