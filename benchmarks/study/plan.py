"""What the study trains: every run as the `aot train` command that trains it.

Language: GPT-2, Llama, AoT-MSSA and AoT-MHSA at three sizes that span 10x in non-embedding parameters. At each
size all four share the width, the heads, the vocabulary (so the same embedding) and the non-embedding parameters:
a GPT-2 or Llama layer holds 12d² weights (attention 4d², MLP 8d²; Llama's gated MLP at 8d/3), an AoT-MSSA layer
2d² and an AoT-MHSA layer 4d², so AoT-MSSA is 6x and AoT-MHSA 3x as deep as GPT-2 (as the AoT paper sizes its
models, and as `benchmarks/replicate` did). Every run sees the same number of training tokens per non-embedding
parameter, in the same order, with the same optimizer and schedule.

Everything that changes a number lives here; a record names its run and holds the command that trained it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

CHECKPOINT_STEPS = 100  # about this many steps between checkpoints (minutes at every size), so a kill costs little
KNN_K = 0.5  # k = n/2 of the visible keys (KVT's rule of thumb)
AOT_LAYERS_PER_GPT2_LAYER = {"aot-mssa": 6, "aot-mhsa": 3}  # 12d² / 2d² and 12d² / 4d²: equal parameters
MAIN_ARCHS = ("gpt2", "llama", "aot-mssa", "aot-mhsa")
# The earlier version's Hybrid 81M / Full MLP 109M hold 0.84x / 1.41x the non-embedding weights of its AoT 102M.
# They run at the smallest size, whose AoT-MSSA holds 2 x 6 layers x 2d² = 24d²: Hybrid with 4 layers (a 4x MLP,
# 8d², in the first 2) holds 24d² (1.0x), Full MLP with 3 layers 30d² (1.25x): the nearest whole depths.
ABLATION_LAYERS = {"aot-mssa-hybrid": 4, "aot-mssa-full": 3}
ABLATION_PRESETS = {"aot-mssa-hybrid": "aot-mssa-l-hybrid", "aot-mssa-full": "aot-mssa-l-full"}


@dataclass(frozen=True)
class Size:
    """One model size: the GPT-2 depth, and the width and heads every architecture shares at this size."""

    name: str
    hidden_size: int
    num_attention_heads: int
    gpt2_layers: int

    @property
    def non_embedding(self) -> int:
        """12d² per GPT-2 layer (LayerNorms and biases aside): the parameter count the sizes and tokens follow."""
        return 12 * self.hidden_size**2 * self.gpt2_layers


@dataclass(frozen=True)
class Run:
    """One training run: its name (the record's file name), architecture, size, seed and `aot train` arguments."""

    name: str
    section: str
    arch: str  # gpt2, llama, aot-mssa, aot-mhsa, aot-mssa-hybrid, aot-mssa-full; `+knn` for a k-NN twin
    size: str
    seed: int
    main: bool  # a main row: trained before every other run
    arguments: tuple[str, ...]  # model arguments of `aot train lm` (the runner adds data, schedule and output)
    steps: int
    tokens: int


@dataclass(frozen=True)
class Study:
    """The language study: sizes, seeds, tokens per parameter, data shapes and the schedule of every run."""

    sizes: tuple[Size, ...] = (
        Size("S", 96, 3, 2),  # 221k non-embedding parameters
        Size("M", 128, 4, 4),  # 786k
        Size("L", 224, 7, 4),  # 2.41M: 10.9x S (10.9x also counting LayerNorms and biases)
    )
    seeds: tuple[int, ...] = (0, 1)  # both at the smallest size, for the noise; the first elsewhere
    vocab_size: int = 8192  # a byte-level BPE trained on the corpus; see README
    block_size: int = 256
    batch_size: int = 16  # 4,096 tokens a step
    # 20, as Chinchilla's compute-optimal ratio. At 10, S-aot-mssa-seed0 ended 0.93 nats below the unigram
    # floor (validation loss 5.888, commit 9dcc682), short of the 1 nat every main run must clear: retired.
    tokens_per_parameter: float = 20.0
    learning_rate: float = 2e-3
    warmup: float = 0.05  # of the steps, then cosine decay
    evaluations: int = 10  # validation points along each curve
    eval_blocks: int = 256  # validation blocks behind each point, spread over every validation book
    extra: dict = field(default_factory=dict)  # smoke: fewer steps

    def steps(self, size: Size) -> int:
        tokens = self.tokens_per_parameter * size.non_embedding
        return max(2, round(tokens / (self.batch_size * self.block_size)))

    def model_arguments(self, arch: str, size: Size) -> tuple[str, ...]:
        """The model arguments of `aot train lm` for `arch` at `size`."""
        base, knn = arch.removesuffix("+knn"), arch.endswith("+knn")
        fields: dict = {
            "vocab_size": self.vocab_size,
            "hidden_size": size.hidden_size,
            "num_attention_heads": size.num_attention_heads,
            "max_position_embeddings": self.block_size,
        }
        if base in ("gpt2", "llama"):
            fields["num_hidden_layers"] = size.gpt2_layers
            if base == "llama":
                fields["tie_word_embeddings"] = "true"  # one embedding, as GPT-2 and AoT: the same count
            if knn:
                fields["attn_implementation"] = "knn"  # the package's kernel, through transformers' registry
            flags = ("--model_type", base, "--preset", "aot-mssa-l-base")  # the preset supplies only the MLP ratio
        elif base in AOT_LAYERS_PER_GPT2_LAYER:
            fields["num_hidden_layers"] = AOT_LAYERS_PER_GPT2_LAYER[base] * size.gpt2_layers
            flags = ("--preset", "aot-mssa-l-base" if base == "aot-mssa" else "aot-mhsa-l-base")
        else:
            fields["num_hidden_layers"] = ABLATION_LAYERS[base]
            flags = ("--preset", ABLATION_PRESETS[base])
        if knn:
            fields["knn_k"] = KNN_K
        return (*flags, "--config_overrides", ",".join(f"{k}={v}" for k, v in fields.items()))

    def runs(self) -> list[Run]:
        """Every language run in the order it trains: the smallest size's main rows (two seeds, so the noise is known
        early), its ablations and k-NN twins, then the main rows of each larger size."""
        smallest = self.sizes[0]
        order = [(arch, smallest, seed, True) for seed in self.seeds for arch in MAIN_ARCHS]
        # The smallest size's ablations and k-NN twins next: together 4% of the study's compute, they decide two
        # claims; the larger sizes' main rows (most of the compute) follow.
        order += [(arch, smallest, self.seeds[0], False) for arch in (*ABLATION_LAYERS, "aot-mssa+knn", "gpt2+knn")]
        for size in self.sizes[1:]:
            order += [(arch, size, self.seeds[0], True) for arch in MAIN_ARCHS]
        runs = []
        for arch, size, seed, main in order:
            steps = self.extra.get("steps") or self.steps(size)
            name = f"{size.name}-{arch}-seed{seed}"
            arguments = self.model_arguments(arch, size)
            runs.append(
                Run(
                    name,
                    "language",
                    arch,
                    size.name,
                    seed,
                    main,
                    arguments,
                    steps,
                    steps * self.batch_size * self.block_size,
                )
            )
        return runs


STUDY = Study()
# The tests' study: the same code at a few steps on tiny shapes.
SMOKE = Study(
    sizes=(Size("S", 16, 2, 1), Size("M", 24, 2, 1), Size("L", 32, 2, 2)),
    vocab_size=300,
    block_size=16,
    batch_size=2,
    evaluations=2,
    eval_blocks=4,
    extra={"steps": 2},
)


VISION_ARCHS = ("vit", "crate", "aot-mssa", "aot-mhsa")


@dataclass(frozen=True)
class VisionStudy:
    """CIFAR-10 (the shared training archives, a fixed 45,000 / 5,000 split): ViT, CRATE, AoT-MSSA and AoT-MHSA at
    the same depth and width (the ICML paper's Tables 1-2 compare them so), k-NN twins of ViT and AoT-MSSA, RandAugment
    on top of crop and flip, as the papers train."""

    num_classes: int = 10  # CIFAR-10's; the head's size, which the planned FLOPs count
    train_images: int = 45_000  # the training side of the fixed split (the other 5,000 validate)
    hidden_size: int = 192
    num_attention_heads: int = 3  # head size 64, as ViT-Tiny
    num_hidden_layers: int = 6
    patch_size: int = 4  # 32 px images: 64 patches + the class token
    # Twenty epochs: at ten, ViT's seed spread (about 4 points) was as large as its margin over the floor, at
    # RandAugment magnitude 9 and 5 alike (commits 44b3e06, a458e70); the numbers are in the study README's "Vision".
    epochs: float = 20
    batch_size: int = 128
    learning_rate: float = 1e-3
    weight_decay: float = 0.05
    warmup: float = 0.05
    rand_augment_magnitude: int = 5
    seeds: tuple[int, ...] = (0, 1)  # both for the four main rows
    vit_floor: float = 55.0  # the validation accuracy (%) every ViT run must reach: the baseline is a real one
    extra: dict = field(default_factory=dict)  # smoke: a few steps on a few images

    def model_arguments(self, arch: str) -> tuple[str, ...]:
        base, knn = arch.removesuffix("+knn"), arch.endswith("+knn")
        fields: dict = {
            "hidden_size": self.hidden_size,
            "num_attention_heads": self.num_attention_heads,
            "num_hidden_layers": self.num_hidden_layers,
            "patch_size": self.patch_size,
        }
        if base == "vit":
            flags: tuple[str, ...] = ("--model_type", "vit", "--preset", "aot-v-tiny")  # MLP 4x, as ViT's
            if knn:
                fields["attn_implementation"] = "knn"
        else:
            flags = ("--preset", "aot-mhsa-v" if base == "aot-mhsa" else "aot-mssa-v")
            fields["image_size"] = 32
            if base == "crate":  # MSSA followed by an ISTA step in every layer (CRATE)
                fields.update(mlp_layers="all", mlp_type="ista")
        if knn:
            fields["knn_k"] = KNN_K
        return (*flags, "--config_overrides", ",".join(f"{k}={v}" for k, v in fields.items()))

    def runs(self) -> list[Run]:
        """ViT with every seed (the floor every comparison stands on is decided first), the other main rows with every
        seed, then the k-NN twins."""
        order = [("vit", seed, True) for seed in self.seeds]
        order += [(arch, seed, True) for seed in self.seeds for arch in VISION_ARCHS if arch != "vit"]
        order += [(arch, self.seeds[0], False) for arch in ("vit+knn", "aot-mssa+knn")]
        steps = self.extra.get("steps") or round(self.epochs * self.train_images / self.batch_size)
        return [
            Run(f"cifar10-{arch}-seed{seed}", "vision", arch, "cifar10", seed, main, self.model_arguments(arch), steps,
                steps * self.batch_size)
            for arch, seed, main in order
        ]  # fmt: skip


VISION = VisionStudy()
VISION_SMOKE = VisionStudy(
    hidden_size=16, num_attention_heads=2, num_hidden_layers=1, batch_size=4, extra={"steps": 2}
)


def schedule(study: Study, vision: VisionStudy) -> list[Run]:
    """Every run in the order the study trains them: the language runs of every size but the largest, then vision,
    then the largest size's main rows, which take most of the compute (so vision's claims are decided before them)."""
    language, largest = study.runs(), study.sizes[-1].name
    return [r for r in language if r.size != largest] + vision.runs() + [r for r in language if r.size == largest]
