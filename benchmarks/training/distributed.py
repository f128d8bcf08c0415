"""DDP against FSDP2 on this CPU, in one run: training throughput of 1 and 2 processes for each, and the peak
memory of every rank for a model large enough for sharding to matter.

    python -m benchmarks.training.distributed                  # ~10 min on 2 shared cores
    python -m benchmarks.training.distributed --skip-memory    # throughput only

Throughput: the same `aot train lm` command (a 4-layer width-256 AoT-MSSA LM on tinyshakespeare, global batch 16
blocks of 128 tokens, 1 thread per process) launched with `torchrun --nproc_per_node 1|2`, plain (DDP when 2) and
with FSDP2 (`--fsdp full_shard --fsdp_config '{"version": 2, "transformer_layer_cls_to_wrap": ["AoTLayer"]}'`).
Trainer's samples per second over `--max-steps` optimizer steps. Rounds alternate the four rows so load from other
users of the machine falls on all of them.

Memory: AoT-MSSA-L Base (102M parameters, GPT-2 vocabulary) for a few AdamW steps with 2 processes, DDP against
FSDP2; every rank reports its peak resident memory (`ru_maxrss`) at the end of training and its resident memory
before the model was built, so the difference is what the model, its gradients and AdamW's state took (and, after
the final export, which gathers the full weights on rank 0, the peak including it). With DDP each rank holds all of
them; with FSDP each holds a half (plus one gathered layer at a time).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT.parent / "shared" / "data"
# On the command line `--fsdp` takes the sharding strategy (a YAML recipe can say `fsdp: true`).
FSDP_CONFIG = {"version": 2, "transformer_layer_cls_to_wrap": ["AoTLayer"]}
FSDP = ["--fsdp", "full_shard", "--fsdp_config", json.dumps(FSDP_CONFIG)]


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: kilobytes


def worker(argv: list[str]) -> int:
    """One rank of a memory run: train with the library's entry points, then write this rank's memory."""
    sys.path.insert(0, str(ROOT / "src"))
    from transformers import TrainerCallback

    from aot_transformers.training.lm import parse_lm_arguments, prepare_lm_training, run_lm_training

    before = _rss_mb()
    record: dict = {"rank": int(os.environ.get("RANK", 0)), "rss_before_model_mb": round(before, 1)}

    class PeakAtTrainEnd(TrainerCallback):
        """The peak of training itself, read before the final export (which gathers the full weights on rank 0)."""

        def on_train_end(self, args, state, control, **kwargs):
            record["peak_rss_mb"] = round(_rss_mb(), 1)

    model_args, data_args, publish_args, lora, optim, training_args = parse_lm_arguments(argv)
    run = prepare_lm_training(
        model_args, data_args, training_args, publish_args, [PeakAtTrainEnd()], lora=lora, optim=optim
    )
    record["parameters"] = sum(p.numel() for p in run.trainer.model.parameters())
    run_lm_training(run)
    record["peak_rss_with_export_mb"] = round(_rss_mb(), 1)
    Path(training_args.output_dir, f"memory-rank{record['rank']}.json").write_text(json.dumps(record))
    return 0


def _launch(processes: int, arguments: list[str], output_dir: Path, script: list[str] | None = None) -> None:
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or "torchrun"
    target = script or ["-m", "aot_transformers.training.lm"]
    command = [torchrun, "--standalone", "--nproc_per_node", str(processes), *target, *arguments]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run(command, env=env, capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")


def throughput(args, root: Path) -> dict:
    def arguments(output_dir: Path, per_device: int, tokenizer: list[str] | None = None) -> list[str]:
        tokenizer = tokenizer or ["--tokenizer_name_or_path", str(root / "tokenizer-run" / "tokenizer")]
        return [
            "--preset", "aot-mssa-l-tiny", "--config_overrides", args.config_overrides, *tokenizer,
            "--dataset_name", args.data, "--block_size", "128", "--per_device_train_batch_size", str(per_device),
            "--max_steps", str(args.max_steps), "--learning_rate", "1e-3", "--eval_strategy", "no",
            "--save_strategy", "no", "--report_to", "none", "--use_cpu", "--disable_tqdm", "true", "--seed", "0",
            "--make_plots", "false", "--logging_steps", "1000", "--output_dir", str(output_dir),
        ]  # fmt: skip

    # Train the tokenizer once (a 1-step run) and share it, so every row sees identical data.
    first = arguments(root / "tokenizer-run", args.global_batch, ["--tokenizer_vocab_size", "1024"])
    _launch(1, [*first, "--max_steps", "1"], root / "tokenizer-run")
    rows = {f"{kind} x {n}": [] for kind in ("DDP", "FSDP2") for n in (1, 2)}
    for _ in range(args.rounds):
        for name in rows:
            kind, processes = name.split(" x ")
            processes = int(processes)
            folder = root / name.replace(" ", "")
            extra = FSDP if kind == "FSDP2" else []
            _launch(processes, [*arguments(folder, args.global_batch // processes), *extra], folder)
            rows[name].append(json.loads((folder / "all_results.json").read_text())["train_samples_per_second"])
    best = {name: max(values) for name, values in rows.items()}
    return {
        "config_overrides": args.config_overrides,
        "global_batch_blocks": args.global_batch,
        "block_size": 128,
        "steps": args.max_steps,
        "rounds": args.rounds,
        "samples_per_second": rows,
        "best_samples_per_second": best,
        "two_over_one": {kind: best[f"{kind} x 2"] / best[f"{kind} x 1"] for kind in ("DDP", "FSDP2")},
        "fsdp_over_ddp": {n: best[f"FSDP2 x {n}"] / best[f"DDP x {n}"] for n in (1, 2)},
    }


def memory(args, root: Path) -> dict:
    results = {}
    for kind, extra in (("DDP", []), ("FSDP2", FSDP)):
        folder = root / f"memory-{kind}"
        arguments = [
            "--preset", "aot-mssa-l-base", "--tokenizer_name_or_path", str(DATA / "tokenizer-gpt2"),
            "--dataset_name", args.data, "--block_size", "64", "--per_device_train_batch_size", "1",
            "--max_steps", str(args.memory_steps), "--max_train_samples", "64", "--eval_strategy", "no",
            "--save_strategy", "no", "--report_to", "none", "--use_cpu", "--disable_tqdm", "true",
            "--make_plots", "false", "--output_dir", str(folder), *extra,
        ]  # fmt: skip
        _launch(2, ["--worker", *arguments], folder, script=[str(Path(__file__).resolve())])
        ranks = [json.loads((folder / f"memory-rank{r}.json").read_text()) for r in range(2)]
        shutil.rmtree(folder / "model", ignore_errors=True)
        results[kind] = {
            "ranks": ranks,
            "peak_rss_mb": [r["peak_rss_mb"] for r in ranks],
            "peak_rss_with_export_mb": [r["peak_rss_with_export_mb"] for r in ranks],
            "model_state_mb": [round(r["peak_rss_mb"] - r["rss_before_model_mb"], 1) for r in ranks],
        }
    results["parameters"] = results["DDP"]["ranks"][0]["parameters"]
    results["fsdp_over_ddp_peak"] = max(results["FSDP2"]["peak_rss_mb"]) / max(results["DDP"]["peak_rss_mb"])
    results["fsdp_over_ddp_model_state"] = max(results["FSDP2"]["model_state_mb"]) / max(
        results["DDP"]["model_state_mb"]
    )
    return results


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        return worker(argv[1:])
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=str(DATA / "text" / "tinyshakespeare" / "input.txt"))
    parser.add_argument("--output-dir", default=str(ROOT / "runs" / "training" / "distributed"))
    parser.add_argument("--max-steps", type=int, default=30)
    parser.add_argument("--global-batch", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--config-overrides", default="hidden_size=256,num_hidden_layers=4,num_attention_heads=4")
    parser.add_argument("--memory-steps", type=int, default=3)
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument(
        "--memory-only", action="store_true", help="rerun the memory part into the existing results file"
    )
    args = parser.parse_args(argv)

    from .._common import invocation, updating_command
    from ._results import RESULTS, write_summary

    root = Path(args.output_dir)
    if args.memory_only:
        summary = json.loads((RESULTS / "distributed_ddp_fsdp.json").read_text())
        summary["memory"] = memory(args, root)
        summary["memory_note"] = "memory rerun separately (--memory-only) after the throughput run of the same day"
        # The file holds both runs, so the command that regenerates it is both commands.
        command = updating_command(summary, invocation("benchmarks.training.distributed", argv))
        write_summary(summary, root / "summary.json", "distributed_ddp_fsdp.json", command)
        print(json.dumps(summary["memory"], indent=2))
        return 0
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    summary = {"throughput": throughput(args, root), "note": "2-core machine shared with other engineers' jobs"}
    if not args.skip_memory:
        summary["memory"] = memory(args, root)
    command = invocation("benchmarks.training.distributed", argv)
    write_summary(summary, root / "summary.json", "distributed_ddp_fsdp.json", command)
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
