"""A tiny AoT-MSSA language model on `../shared/data/text` against a unigram model of the same tokens.

    python -m benchmarks.training.lm_vs_unigram                       # ~10 min on 2 shared cores (1,200 steps)
    python -m benchmarks.training.lm_vs_unigram --max-steps 200       # a quick look

Runs `aot train lm` (a byte-level BPE trained on the training text, `aot-mssa-l-tiny` with the vocabulary set to the
tokenizer's, packed 128-token blocks, the last 5% of the lines held out) and reports the validation perplexity of
the LM and of the add-one-smoothed unigram model fitted to the training blocks, computed on the same target tokens.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from .._common import invocation
from ._results import write_summary

ROOT = Path(__file__).resolve().parents[2]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "text"))
    parser.add_argument("--output-dir", default=str(ROOT / "runs" / "training" / "lm_vs_unigram"))
    parser.add_argument("--vocab-size", type=int, default=2048)
    parser.add_argument("--block-size", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--max-steps", type=int, default=1200)
    parser.add_argument("--learning-rate", type=float, default=3e-3)
    args = parser.parse_args(argv)

    from aot_transformers.training.lm import main as train_lm

    output_dir = Path(args.output_dir)
    start = time.perf_counter()
    status = train_lm([
        "--preset", "aot-mssa-l-tiny", "--config_overrides", f"vocab_size={args.vocab_size}",
        "--tokenizer_vocab_size", str(args.vocab_size), "--dataset_name", args.data,
        "--block_size", str(args.block_size), "--per_device_train_batch_size", str(args.batch_size),
        "--per_device_eval_batch_size", "64", "--max_steps", str(args.max_steps),
        "--learning_rate", str(args.learning_rate), "--lr_scheduler_type", "cosine", "--warmup_steps", "100",
        "--weight_decay", "0.01", "--eval_strategy", "steps", "--eval_steps", str(max(args.max_steps // 6, 1)),
        "--logging_steps", "50", "--save_strategy", "no", "--report_to", "none", "--use_cpu", "--seed", "0",
        "--output_dir", str(output_dir), "--model_name", "aot-mssa-l-tiny-shared-text",
    ])  # fmt: skip
    if status != 0:
        return status
    metrics = json.loads((output_dir / "all_results.json").read_text())
    summary = {
        "data": args.data,
        "steps": args.max_steps,
        "tokens_seen": args.max_steps * args.batch_size * args.block_size,
        "validation_perplexity": metrics["eval_perplexity"],
        "unigram_perplexity": metrics["eval_unigram_perplexity"],
        "ratio": metrics["eval_perplexity"] / metrics["eval_unigram_perplexity"],
        "train_seconds": metrics["train_runtime"],
        "wall_seconds": round(time.perf_counter() - start, 1),
    }
    write_summary(
        summary,
        output_dir / "summary.json",
        f"lm_vs_unigram_{args.max_steps}steps.json",
        invocation("benchmarks.training.lm_vs_unigram", argv),
    )
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
