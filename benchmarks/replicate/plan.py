"""What each comparison trains and measures, as a function of `--budget` (1.0 = the default, about an hour on two
quiet cores) or `--smoke` (CI: a few steps of every row, tiny shapes).

Everything that changes a number lives here, so a results file can say exactly which plan produced it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class LanguagePlan:
    """Causal-LM rows: GPT-2 vs AoT at equal parameters, the MLP ablations, and their k-NN twins."""

    hidden_size: int = 96
    num_attention_heads: int = 4
    gpt2_layers: int = 4  # AoT-MSSA gets 6x as many layers (2d² vs 12d² per layer), AoT-MHSA 3x: equal parameters
    block_size: int = 128
    batch_size: int = 4
    max_steps: int = 200
    learning_rate: float = 2e-3
    warmup_ratio: float = 0.1
    weight_decay: float = 0.1
    evaluations: int = 6  # validation-loss points along the curve
    eval_blocks: int = 48  # validation blocks of `block_size` tokens (the same for every row)
    ptb_sentences: int = 400  # the first sentences of the PTB file, as one document
    lambada_passages: int = 100  # the local dev file has 100
    knn_k: float = 0.5  # fraction of the visible keys: k = n/2 (KVT's rule of thumb)
    max_train_lines: int | None = None  # smoke only: read fewer lines of text
    timing_rounds: int = 3


@dataclass(frozen=True)
class VisionPlan:
    """Image-classification rows on CIFAR-10: ViT vs AoT (MSSA, MSSA without LayerNorm, MHSA), and k-NN twins."""

    hidden_size: int = 64
    num_attention_heads: int = 4
    num_hidden_layers: int = 6
    patch_size: int = 8  # 32 px images: 16 patches + CLS
    batch_size: int = 64
    max_steps: int = 400
    learning_rate: float = 2e-3
    warmup_ratio: float = 0.1
    weight_decay: float = 0.05
    evaluations: int = 5
    train_images: int = 25_600  # one pass: max_steps x batch_size images drawn from the 45,000 of the split
    eval_images: int = 2_000
    knn_k: float = 0.5
    timing_rounds: int = 3


@dataclass(frozen=True)
class ComputePlan:
    """Forward cost of the LM presets at batch x tokens: FLOPs of the full shapes, time and memory of shapes scaled
    down by `depth_divisor` / `width_divisor` (head count kept) so that one forward takes seconds, not minutes."""

    batch_size: int = 16
    sequence_length: int = 1024
    depth_divisor: int = 4
    width_divisor: int = 8
    rounds: int = 3
    isolated: bool = True  # one fresh process per model (needed for peak memory)


@dataclass(frozen=True)
class Plan:
    """The whole benchmark: which seeds, and one plan per comparison."""

    budget: float
    smoke: bool
    seeds: tuple[int, ...] = (0, 1)
    language: LanguagePlan = field(default_factory=LanguagePlan)
    vision: VisionPlan = field(default_factory=VisionPlan)
    compute: ComputePlan = field(default_factory=ComputePlan)

    def section_key(self, section: str) -> str:
        """A short hash of one section's settings: results made under other settings are not reused."""
        payload = json.dumps(asdict(getattr(self, section)), sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:12]

    def to_dict(self) -> dict:
        return asdict(self)


def _scaled(value: int, budget: float, minimum: int) -> int:
    return max(minimum, int(round(value * budget)))


def make_plan(budget: float = 1.0, smoke: bool = False, seeds: int = 2) -> Plan:
    """The plan for `budget` (every training run's steps scale linearly with it; evaluation sets shrink only below
    0.5) or for the CI smoke run.

    Raises:
        ValueError: For a non-positive budget or fewer than one seed.
    """
    if not budget > 0:
        raise ValueError(f"--budget must be positive, got {budget}.")
    if seeds < 1:
        raise ValueError(f"--seeds must be at least 1, got {seeds}.")
    seed_tuple = tuple(range(seeds))
    if smoke:
        return Plan(
            budget=0.0,
            smoke=True,
            seeds=seed_tuple,
            language=LanguagePlan(
                hidden_size=16,
                num_attention_heads=2,
                gpt2_layers=1,
                block_size=32,
                batch_size=2,
                max_steps=2,
                evaluations=1,
                eval_blocks=2,
                ptb_sentences=2,
                lambada_passages=2,
                max_train_lines=400,
                timing_rounds=1,
            ),
            vision=VisionPlan(
                hidden_size=16,
                num_attention_heads=2,
                num_hidden_layers=1,
                patch_size=8,
                batch_size=4,
                max_steps=2,
                evaluations=1,
                train_images=40,
                eval_images=20,
                timing_rounds=1,
            ),
            compute=ComputePlan(
                batch_size=1, sequence_length=32, depth_divisor=12, width_divisor=32, rounds=1, isolated=False
            ),
        )
    eval_scale = min(1.0, max(budget, 0.25) * 2)
    base_language, base_vision = LanguagePlan(), VisionPlan()
    return Plan(
        budget=budget,
        smoke=False,
        seeds=seed_tuple,
        language=LanguagePlan(
            max_steps=_scaled(base_language.max_steps, budget, 16),
            eval_blocks=_scaled(base_language.eval_blocks, eval_scale, 16),
            ptb_sentences=_scaled(base_language.ptb_sentences, eval_scale, 50),
        ),
        vision=VisionPlan(
            max_steps=(vision_steps := _scaled(base_vision.max_steps, budget, 16)),
            train_images=min(45_000, vision_steps * base_vision.batch_size),
            eval_images=_scaled(base_vision.eval_images, eval_scale, 500),
        ),
        compute=ComputePlan(rounds=3 if budget >= 0.5 else 2),
    )
