"""The training command group of `aot`: `aot train lm`, `aot train image`, `aot push`, `aot demo`.

`register(subcommands)` adds them to the `aot` parser. `train lm` / `train image` hand every argument after them
to `HfArgumentParser` (our dataclasses plus every `TrainingArguments` flag; `aot train lm --help` lists them all).
Heavy libraries are imported only when a command runs.
"""

from __future__ import annotations

import argparse
import math

# Arguments after `aot train lm` are not options of `aot`: no prefix character, so argparse passes them through.
_NO_PREFIX = "\x00"


def _train(args: argparse.Namespace) -> int:
    from importlib import import_module

    return import_module(f".{args.train_kind}", __package__).main(args.arguments)  # `.lm` or `.image`


def _push(args: argparse.Namespace) -> int:
    from ..hub import push_to_hub

    # Bad input is a UsageError (exit 2), a failed push a HubPushError (exit 1), through the error contract.
    options = ("token", "endpoint", "private", "revision", "commit_message", "create_pr")
    result = push_to_hub(args.folder, args.repo_id, **{name: getattr(args, name) for name in options})
    print(f"Pushed {len(result.files)} files to {result.repo_url}")
    print(f"commit: {result.commit_url}")
    if result.commit_oid:
        print(f'Load this exact version with revision="{result.commit_oid}" and trust_remote_code=True.')
    return 0


def _demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    run_demo(
        args.output_dir, lm_epochs=args.lm_epochs, image_epochs=args.image_epochs, prompt=args.prompt, seed=args.seed
    )
    return 0


def positive_float(text: str) -> float:
    """An argparse type: a finite number > 0 (argparse names the option and exits with code 2 otherwise)."""
    value = float(text)
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}")
    return value


def seed_value(text: str) -> int:
    """An argparse type: a seed in [0, 2**32 - 1], the range numpy and torch accept."""
    value = int(text)
    if not 0 <= value < 2**32:
        raise argparse.ArgumentTypeError(f"must be an integer in [0, 2**32 - 1], got {text!r}")
    return value


def register(subcommands: argparse._SubParsersAction) -> None:
    """Add `train` (with `lm` and `image`), `push` and `demo` to the `aot` subcommands."""
    train = subcommands.add_parser("train", help="train an AoT model with transformers.Trainer")
    kinds = train.add_subparsers(dest="train_kind", required=True, metavar="{lm,image}")
    for name, text in (
        ("lm", "causal-LM pretraining / fine-tuning (`aot train lm --help` for every flag)"),
        ("image", "image classification (`aot train image --help` for every flag)"),
    ):
        parser = kinds.add_parser(name, help=text, description=text, add_help=False, prefix_chars=_NO_PREFIX)
        parser.add_argument(
            "arguments", nargs=argparse.REMAINDER, help="HfArgumentParser arguments or one .json/.yaml"
        )
        parser.set_defaults(func=_train)

    push = subcommands.add_parser("push", help="upload an exported model folder (with its model card) to the Hub")
    push.add_argument("folder", help="folder written by `aot train` or export_model")
    push.add_argument("--repo-id", required=True, help="namespace/name of the model repository")
    push.add_argument("--token", default=None, help="Hub token (default: logged-in token or HF_TOKEN)")
    push.add_argument("--endpoint", default=None, help="Hub URL (default: HF_ENDPOINT or https://huggingface.co)")
    push.add_argument("--private", action="store_true", default=None, help="create the repository as private")
    push.add_argument("--revision", default=None, help="branch to commit to (default: main)")
    push.add_argument("--commit-message", default=None)
    push.add_argument("--create-pr", action="store_true", help="open a pull request instead of committing")
    push.set_defaults(func=_push)

    demo = subcommands.add_parser(
        "demo", help="the main job: train, evaluate, export and reload a tiny AoT LM and image classifier (~5 min)"
    )
    demo.add_argument("--output-dir", default="aot-demo", help="where the hub-ready folders go (default: aot-demo)")
    demo.add_argument("--lm-epochs", type=positive_float, default=6.0, help="epochs of the language model (> 0)")
    demo.add_argument("--image-epochs", type=positive_float, default=30.0, help="epochs of the image model (> 0)")
    demo.add_argument("--prompt", default="The ")
    demo.add_argument("--seed", type=seed_value, default=0)
    demo.set_defaults(func=_demo)
