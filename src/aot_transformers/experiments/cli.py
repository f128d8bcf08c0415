"""`aot experiment NAME [--out DIR] [options]` and `aot inspect MODEL`: thin argument parsing over the study modules.

Options left out keep the defaults of the study's `run` function (argparse.SUPPRESS): the defaults live in one place.
"""

from __future__ import annotations

import argparse
from pathlib import Path

S = argparse.SUPPRESS


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default=S, help="output folder (default: out/experiments/NAME)")
    parser.add_argument("--seed", type=int, default=S, help="random seed")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads (default 1: the studies' tensors are small, and one thread is "
        "fastest on a shared CPU)",
    )


def _add_denoising(sub) -> None:
    p = sub.add_parser(
        "denoising",
        help="AoT Theorem 1 / Fig. 4: SNR per layer of unrolled MSSA",
        description="SNR per layer of Z + η·MSSA(Z) on a noisy mixture of low-rank Gaussians.",
    )
    _common(p)
    p.add_argument("--noise-levels", type=float, nargs="+", default=S, help="δ values (default 0.2 0.5)")
    p.add_argument("--num-subspaces", type=int, default=S, help="K")
    p.add_argument("--subspace-dim", type=int, default=S, help="p")
    p.add_argument("--ambient-dim", type=int, default=S, help="d (default K·p)")
    p.add_argument("--num-tokens", type=int, default=S, help="N")
    p.add_argument("--num-layers", type=int, default=S)
    p.add_argument("--step-size", type=float, default=S, help="η")
    p.add_argument("--tau", type=float, default=S, help="τ of the hard threshold, in (0, 0.5]")
    p.add_argument("--scaling", type=float, default=S, help="factor on the scores (default 1/√p)")


def _add_icl(sub) -> None:
    p = sub.add_parser(
        "icl",
        help="AoT Fig. 6: in-context linear / sparse regression",
        description="Train AoT-MSSA, AoT-MHSA and a transformer with MLPs on regression prompts.",
    )
    _common(p)
    p.add_argument("--dim", type=int, default=S, help="d")
    p.add_argument("--num-points", type=int, default=S, help="examples per prompt (default 2d + 1)")
    p.add_argument("--tasks", nargs="+", default=S, help="linear sparse_linear")
    p.add_argument("--models", nargs="+", default=S, help="aot-mssa aot-mhsa transformer")
    p.add_argument("--hidden-size", type=int, default=S)
    p.add_argument("--num-heads", type=int, default=S)
    p.add_argument("--aot-layers", type=int, default=S)
    p.add_argument("--transformer-layers", type=int, default=S)
    p.add_argument("--steps", type=int, default=S)
    p.add_argument("--batch-size", type=int, default=S)
    p.add_argument("--lr", type=float, default=S)
    p.add_argument("--sparsity", type=int, default=S)
    p.add_argument("--lasso-alpha", type=float, default=S)
    p.add_argument("--eval-prompts", type=int, default=S)
    p.add_argument("--time-budget", type=float, default=S, help="seconds for the whole run")
    p.add_argument("--tokens", default=S, help="token layout: pairs (default; y tokens carry their x) or garg")


def _add_clustering(sub) -> None:
    p = sub.add_parser(
        "clustering",
        help="attention-based clustering: Figs. 1-4 and the closed forms",
        description="Projected SGD of two-head attention on a Gaussian mixture; Monte Carlo checks.",
    )
    _common(p)
    p.add_argument("--dim", type=int, default=S, help="d")
    p.add_argument("--seq-len", type=int, default=S, help="L")
    p.add_argument("--sigmas", type=float, nargs="+", default=S, help="σ values of Fig. 1")
    p.add_argument("--lams", type=float, nargs="+", default=S, help="λ for each σ")
    p.add_argument("--manifold-rho", type=float, default=S, help="ρ of Fig. 1")
    p.add_argument("--rhos", type=float, nargs="+", default=S, help="ρ sweep of Fig. 2")
    p.add_argument("--lr", type=float, default=S)
    p.add_argument("--batch-size", type=int, default=S)
    p.add_argument("--steps", type=int, default=S)
    p.add_argument("--k3-dim", type=int, default=S, help="d of the K = 3 run")
    p.add_argument("--softmax-steps", type=int, default=S)
    p.add_argument("--mc-sequences", type=int, default=S)
    p.add_argument("--mc-seq-len", type=int, default=S)


def _add_knn(sub) -> None:
    p = sub.add_parser(
        "knn",
        help="KVT: noise distillation and training speed of k-NN attention",
        description="Dense vs top-k attention: distance to the relevant mean; CIFAR-10 accuracy.",
    )
    _common(p)
    p.add_argument("--noise-ratios", type=float, nargs="+", default=S)
    p.add_argument("--num-tokens", type=int, default=S)
    p.add_argument("--dim", type=int, default=S)
    p.add_argument("--num-trials", type=int, default=S)
    p.add_argument("--data-dir", default=S, help="folder with vision/cifar10/train_<class>.tar.gz")
    p.add_argument("--per-class", type=int, default=S)
    p.add_argument("--epochs", type=int, default=S)
    p.add_argument("--hidden-size", type=int, default=S)
    p.add_argument("--num-layers", type=int, default=S)
    p.add_argument("--skip-training", action="store_true", default=S)


def _add_attention_maps(sub) -> None:
    p = sub.add_parser(
        "attention-maps",
        help="AoT Fig. 7: [CLS]-to-patch attention of each head",
        description="Attention maps of a trained image classifier (trains a small one if none).",
    )
    _common(p)
    p.add_argument("--model", default=S, help="saved AoTForImageClassification folder")
    p.add_argument("--dataset", default=S, help="mnist or cifar10 (when training)")
    p.add_argument("--layer", type=int, default=S)
    p.add_argument("--num-images", type=int, default=S)
    p.add_argument("--epochs", type=int, default=S)
    p.add_argument("--per-class", type=int, default=S)
    p.add_argument("--data-dir", default=S)
    p.add_argument("--hidden-size", type=int, default=S)
    p.add_argument("--num-layers", type=int, default=S)
    p.add_argument("--patch-size", type=int, default=S)
    p.add_argument("--lr", type=float, default=S)
    p.add_argument("--train-images", type=int, default=S, help="cap on the training images")
    p.add_argument("--no-save-model", dest="save_model", action="store_false", default=S)


_ADDERS = {
    "denoising": _add_denoising,
    "icl": _add_icl,
    "clustering": _add_clustering,
    "knn": _add_knn,
    "attention-maps": _add_attention_maps,
}


def _run_experiment(args: argparse.Namespace) -> int:
    import torch

    from . import run_experiment

    options = {key: value for key, value in vars(args).items() if key not in ("command", "study", "func", "threads")}
    torch.set_num_threads(max(1, args.threads))
    results = run_experiment(args.study, **options)
    _print_claims(results, options.get("out") or Path("out") / "experiments" / args.study)
    return 0


def _run_inspect(args: argparse.Namespace) -> int:
    import torch

    from .diagnostics import run

    torch.set_num_threads(max(1, args.threads))
    options = {key: value for key, value in vars(args).items() if key not in ("command", "func", "threads")}
    results = run(**options)
    _print_claims(results, options.get("out") or Path("out") / "experiments" / "inspect")
    return 0


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
    studies = experiment.add_subparsers(dest="study", required=True, metavar="NAME")
    for adder in _ADDERS.values():
        adder(studies)
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
    inspect.add_argument("--threads", type=int, default=1)
    inspect.set_defaults(func=_run_inspect)
