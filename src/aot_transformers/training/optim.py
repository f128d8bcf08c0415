"""Optimizers beyond Trainer's own `--optim` list: Lion, which the AoT paper uses for its vision models (Sec. 4.1:
pre-training on ImageNet-21K and fine-tuning on ImageNet-1K with Lion).

Lion comes from `lion-pytorch` (lucidrains; part of the `train` extra): pure PyTorch, maintained, and exactly the
reference update of Chen et al., *Symbolic Discovery of Optimization Algorithms* (2023), Algorithm 2 — with
momentum `m`, `θ ← θ·(1 − lr·λ) − lr·sign(β1·m + (1 − β1)·g)`, then `m ← β2·m + (1 − β2)·g`. Trainer's built-in
`--optim lion_32bit` needs bitsandbytes, whose optimizers target CUDA; this one runs on every device and under
FSDP (its state is shaped like each parameter shard).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .._io import arg
from .arguments import TrainingSetupError

if TYPE_CHECKING:
    from transformers import TrainingArguments

OPTIMIZERS = ("trainer", "lion")


@dataclass
class OptimizerArguments:
    """The optimizer: Trainer's `--optim` (default), or Lion with `--optimizer lion`."""

    optimizer: str = arg(
        "trainer", "'trainer' (Trainer's --optim, AdamW by default) or 'lion' (the paper's vision optimizer)."
    )
    lion_beta1: float = arg(0.9, "Lion's interpolation factor β1.")
    lion_beta2: float = arg(0.99, "Lion's momentum decay β2.")

    def check(self) -> None:
        """Raise `TrainingSetupError` naming the argument for a value that cannot be used."""
        if self.optimizer not in OPTIMIZERS:
            raise TrainingSetupError("", argument="--optimizer", value=self.optimizer, allowed=" or ".join(OPTIMIZERS))
        for name, value in (("--lion_beta1", self.lion_beta1), ("--lion_beta2", self.lion_beta2)):
            if not 0 <= value < 1:
                raise TrainingSetupError("", argument=name, value=value, allowed="0 <= beta < 1")


def optimizer_cls_and_kwargs(
    arguments: OptimizerArguments | None, training_args: TrainingArguments
) -> tuple[type, dict] | None:
    """`Trainer(optimizer_cls_and_kwargs=...)` for the chosen optimizer, or None for Trainer's own. The learning
    rate, its schedule and the weight decay come from `TrainingArguments` as for any optimizer."""
    if arguments is None:
        return None
    arguments.check()
    if arguments.optimizer == "trainer":
        return None
    try:
        from lion_pytorch import Lion
    except ImportError:
        raise TrainingSetupError(
            "Lion needs lion-pytorch: pip install 'aot-transformers[train]'", argument="--optimizer", value="lion"
        ) from None
    if not training_args.learning_rate > 0:
        raise TrainingSetupError("", argument="--learning_rate", value=training_args.learning_rate, allowed="> 0")
    betas = (arguments.lion_beta1, arguments.lion_beta2)
    return Lion, {"lr": training_args.learning_rate, "betas": betas, "weight_decay": training_args.weight_decay}


__all__ = ["OPTIMIZERS", "OptimizerArguments", "optimizer_cls_and_kwargs"]
