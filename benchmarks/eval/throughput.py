"""Evaluation throughput of `aot eval` vs lm-evaluation-harness on the same model, data and batch size.

    python -m benchmarks.eval.throughput out/eval_bench/aot --name aot      # ~10 minutes on 2 busy cores
    python -m benchmarks.eval.throughput out/eval_bench/gpt2 --name gpt2

For each task both tools run in alternating rounds (so a change in machine load hits both alike) on an already
loaded model — model loading and lm-eval's import are not timed; reading the data and building the requests are.
Throughput = tokens of the task's texts (context + target for LAMBADA, every document token for PTB) / best wall
time; also per CPU second of the process (`time.process_time`, all threads), which a busy shared machine disturbs
less than wall time. The numbers of both runs are compared too (they must agree). Writes
benchmarks/eval/results/throughput_NAME.json.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

import torch

from aot_transformers.evaluation import evaluate_model, lm_eval_tasks_path, load_model_and_tokenizer
from aot_transformers.evaluation.tasks import TASKS, load_source, resolve_sources

from .._common import invocation, write_results

ROOT = Path(__file__).resolve().parents[2]
RESULTS = Path(__file__).resolve().parent / "results"
# (our metric, lm-eval metric) checked for agreement in each task
AGREEMENT = {
    "ptb": ("bits_per_byte", "bits_per_byte,none"),
    "wikitext": ("bits_per_byte", "bits_per_byte,none"),
    "lambada": ("bits_per_byte", "bits_per_byte,none"),
    "lambada_acc": ("acc", "acc,none"),
    "cbt_cn": ("acc", "acc,none"),
    "cbt_ne": ("acc", "acc,none"),
}


def task_tokens(task: str, tokenizer, data_dir: Path, data: dict[str, str]) -> int:
    """Tokens of the texts a task reads (the same count for both tools)."""
    source = resolve_sources([task], data_dir, data)[TASKS[task].dataset]
    items = load_source(source)
    encode = lambda text: len(tokenizer(text, add_special_tokens=False)["input_ids"])
    if TASKS[task].kind == "cloze":
        return sum(encode(c + k) for example in items for c, k in map(example.scoring_pair, example.candidates))
    return sum(encode(text) for text in items)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="model folder")
    parser.add_argument("--name", required=True, help="results file suffix")
    parser.add_argument("--data-dir", type=Path, default=ROOT.parent / "shared" / "data" / "eval-dev")
    parser.add_argument("--data", action="append", default=[], metavar="TASK=PATH", help="as `aot eval lm --data`")
    parser.add_argument("--tasks", default="ptb,lambada_acc")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)

    import lm_eval
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    logging.getLogger("lm-eval").setLevel(logging.ERROR)  # one truncation warning per request otherwise
    torch.set_num_threads(args.threads)
    model, tokenizer = load_model_and_tokenizer(args.model, device="cpu")
    window = model.config.max_position_embeddings if hasattr(model.config, "max_position_embeddings") else None
    harness = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=args.batch_size, device="cpu", max_length=window)
    data = dict(item.split("=", 1) for item in args.data)
    manager = TaskManager(
        include_path=str(lm_eval_tasks_path()),
        include_defaults=False,
        metadata={"data_dir": str(args.data_dir), **data},
    )

    report = {"model": args.model, "batch_size": args.batch_size, "threads": args.threads, "data": data, "tasks": {}}
    for task in args.tasks.split(","):
        tokens = task_tokens(task, tokenizer, args.data_dir, data)
        best = {"aot_eval": float("inf"), "lm_eval": float("inf")}
        cpu = {"aot_eval": float("inf"), "lm_eval": float("inf")}
        values = {}
        for round_ in range(args.rounds):
            start, start_cpu = time.perf_counter(), time.process_time()
            ours = evaluate_model(
                model, [task], tokenizer=tokenizer, data_dir=args.data_dir, data=data, batch_size=args.batch_size
            )
            best["aot_eval"] = min(best["aot_eval"], time.perf_counter() - start)
            cpu["aot_eval"] = min(cpu["aot_eval"], time.process_time() - start_cpu)
            start, start_cpu = time.perf_counter(), time.process_time()
            theirs = lm_eval.simple_evaluate(
                model=harness, tasks=[TASKS[task].lm_eval_task], task_manager=manager, bootstrap_iters=0
            )
            best["lm_eval"] = min(best["lm_eval"], time.perf_counter() - start)
            cpu["lm_eval"] = min(cpu["lm_eval"], time.process_time() - start_cpu)
            ours_metric, their_metric = AGREEMENT[task]
            values = {
                "aot_eval": ours.results[task][ours_metric],
                "lm_eval": theirs["results"][TASKS[task].lm_eval_task][their_metric],
            }
            print(f"{task} round {round_}: wall {best} cpu {cpu}  {ours_metric}: {values}", flush=True)
            if abs(values["aot_eval"] - values["lm_eval"]) > 1e-4 * max(1.0, abs(values["lm_eval"])):
                raise SystemExit(f"{task}: the two tools disagree ({values}); not the same data?")
        report["tasks"][task] = {
            "tokens": tokens,
            "seconds": best,
            "cpu_seconds": cpu,
            "tokens_per_cpu_second": {tool: tokens / seconds for tool, seconds in cpu.items()},
            "tokens_per_second": {tool: tokens / seconds for tool, seconds in best.items()},
            "speedup_aot_eval_over_lm_eval": best["lm_eval"] / best["aot_eval"],
            "cpu_speedup_aot_eval_over_lm_eval": cpu["lm_eval"] / cpu["aot_eval"],
            "metric": AGREEMENT[task][0],
            "values": values,
        }
    path = write_results(
        RESULTS / f"throughput_{args.name}.json", report, invocation("benchmarks.eval.throughput", argv)
    )
    print(json.dumps(report, indent=2))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
