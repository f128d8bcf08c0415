"""An AoT image classifier on the CIFAR-10 training archives of `../shared/data/vision/cifar10`.

    # the acceptance run (README.md: 63.0% after 48 min): 2 DDP processes x 1 thread, global batch 128, 20 epochs
    OMP_NUM_THREADS=1 torchrun --standalone --nproc_per_node 2 \\
        -m benchmarks.training.cifar10 --epochs 20 --batch-size 64
    python -m benchmarks.training.cifar10                  # 1 process, 10 epochs (55.8% after 40 min)
    python -m benchmarks.training.cifar10 --epochs 2       # a shortened run

Configuration (AoT-MHSA, attention only, no MLP): 32 px, patch 4 (64 patch tokens + CLS), width 128, 6 layers,
4 heads, mean pooling, 411k parameters; AdamW, learning rate 2e-3 with 5% warm-up and cosine decay, weight decay
0.05, global batch 128; random crop (padding 4) + horizontal flip. 45,000 images train, 5,000 (stratified) validate.
MSSA at the same size (`--config-overrides` without `attention_type=mhsa`) learns more slowly here (README.md).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from .._common import invocation
from ._results import write_summary

ROOT = Path(__file__).resolve().parents[2]
OVERRIDES = (
    "image_size=32,patch_size=4,hidden_size=128,num_hidden_layers=6,num_attention_heads=4,pooling=mean,"
    "attention_type=mhsa"
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "vision" / "cifar10"))
    parser.add_argument("--output-dir", default=str(ROOT / "runs" / "training" / "cifar10"))
    parser.add_argument("--epochs", type=float, default=10.0)
    parser.add_argument("--config-overrides", default=OVERRIDES)
    parser.add_argument("--batch-size", type=int, default=128, help="per process (global: x processes)")
    parser.add_argument("--learning-rate", type=float, default=2e-3)
    args = parser.parse_args(argv)

    from transformers.trainer_utils import get_last_checkpoint

    from aot_transformers.training.image import main as train_image

    output_dir = Path(args.output_dir)
    processes = int(os.environ.get("WORLD_SIZE", "1"))  # torchrun / accelerate launch set it
    global_batch = args.batch_size * processes
    warmup = int(0.05 * args.epochs * 45_000 / global_batch)  # 5% of the optimizer steps
    start = time.perf_counter()
    status = train_image([
        "--preset", "aot-v-tiny", "--config_overrides", args.config_overrides, "--dataset_name", args.data,
        "--validation_split_percentage", "10", "--augment", "yes",
        "--per_device_train_batch_size", str(args.batch_size), "--per_device_eval_batch_size", "256",
        "--num_train_epochs", str(args.epochs), "--learning_rate", str(args.learning_rate),
        "--lr_scheduler_type", "cosine", "--warmup_steps", str(warmup), "--weight_decay", "0.05",
        "--eval_strategy", "epoch", "--logging_steps", "50", "--save_strategy", "epoch", "--save_total_limit", "1",
        "--report_to", "none", "--use_cpu", "--seed", "0", "--dataloader_num_workers", "0",
        "--output_dir", str(output_dir), "--model_name", "aot-v-cifar10",
    ])  # fmt: skip
    if status != 0 or int(os.environ.get("RANK", "0")) != 0:
        return status
    metrics = json.loads((output_dir / "all_results.json").read_text())
    last = get_last_checkpoint(str(output_dir))
    history = json.loads((Path(last) / "trainer_state.json").read_text())["log_history"] if last else []
    summary = {
        "config_overrides": args.config_overrides,
        "epochs": args.epochs,
        "processes": processes,
        "global_batch_size": global_batch,
        "learning_rate": args.learning_rate,
        "validation_accuracy": metrics["eval_accuracy"],
        "validation_accuracy_per_epoch": {
            f"{e['epoch']:g}": round(e["eval_accuracy"], 4) for e in history if "eval_accuracy" in e
        },
        "train_seconds": metrics["train_runtime"],
        "train_samples_per_second": metrics["train_samples_per_second"],
        "wall_seconds": round(time.perf_counter() - start, 1),
    }
    kind = "mhsa" if "attention_type=mhsa" in args.config_overrides else "mssa"
    write_summary(
        summary,
        output_dir / "summary.json",
        f"cifar10_{kind}_{args.epochs:g}epochs.json",
        invocation("benchmarks.training.cifar10", argv),
    )
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
