"""Tensor parallelism against data parallelism for one AoT LM on 2 CPU processes (torchrun, gloo).

    python -m benchmarks.bench_tp            # a few minutes on an idle 2-core machine

Two models, each with one global batch, take AdamW training steps three ways. `activations`: MSSA, 8 layers, width
1024, 16 heads, vocab 8192 (25M parameters), 8 sequences of 256 tokens — activations dominate the memory. `weights`:
8 layers, width 2048, 32 heads (84M parameters), 2 sequences of 128 tokens — weights, gradients and optimizer state
dominate it. The modes:

- `single`: one process, the whole batch;
- `dp`: 2 processes under `DistributedDataParallel`, 4 sequences each (every rank holds the whole model, its gradients
  and its optimizer state);
- `tp`: 2 processes, `from_pretrained(..., tp_plan="auto")` (the model's `base_model_tp_plan`: shared projections
  column-wise, output projections row-wise), the whole batch on both ranks (each holds half of every attention weight).

Per mode: the median time of a step (of 5, after 2 warm-up steps) and each rank's peak resident memory (VmHWM) with its
part above the memory after the model was loaded. Each process runs with 1 thread, so a mode uses at most as many
cores as it has processes (`single` runs with 2 threads, the same core count as the others). Writes results/tp.json.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ._common import write_results

SETTINGS = {
    "activations": {"layers": 8, "width": 1024, "heads": 16, "vocab": 8192, "batch": 8, "length": 256},
    "weights": {"layers": 8, "width": 2048, "heads": 32, "vocab": 8192, "batch": 2, "length": 128},
}
WARMUP, STEPS = 2, 5


def _rss_mb(field: str) -> float:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(field)


def worker(mode: str, folder: str, batch_size: int, length: int) -> None:
    """One process of a mode: load, train `WARMUP + STEPS` steps, print this rank's numbers as JSON."""
    import torch

    from aot_transformers import AoTForCausalLM

    distributed = mode != "single"
    torch.set_num_threads(2 if mode == "single" else 1)
    if distributed:
        import torch.distributed as dist

        if mode == "dp":
            dist.init_process_group("gloo")
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    else:
        rank, world = 0, 1
    model = AoTForCausalLM.from_pretrained(folder, tp_plan="auto" if mode == "tp" else None)
    model.train()
    vocab_size = model.config.vocab_size
    if mode == "dp":
        model = torch.nn.parallel.DistributedDataParallel(model)
    loaded = _rss_mb("VmRSS")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)
    generator = torch.Generator().manual_seed(0)
    batch = torch.randint(0, vocab_size, (batch_size, length), generator=generator)
    if mode == "dp":
        batch = batch.chunk(world)[rank]
    times = []
    for step in range(WARMUP + STEPS):
        start = time.perf_counter()
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if distributed:
            torch.distributed.barrier()
        if step >= WARMUP:
            times.append(time.perf_counter() - start)
    print(
        json.dumps(
            {
                "rank": rank,
                "step_seconds": statistics.median(times),
                "step_seconds_range": [min(times), max(times)],
                "peak_rss_mb": round(_rss_mb("VmHWM"), 1),
                "peak_above_loaded_mb": round(_rss_mb("VmHWM") - loaded, 1),
                "loss": round(loss.item(), 4),
            }
        ),
        flush=True,
    )
    if distributed:
        torch.distributed.destroy_process_group()


def run_mode(mode: str, folder: str, batch_size: int, length: int) -> dict:
    command = [sys.executable] if mode == "single" else [sys.executable, "-m", "torch.distributed.run"]
    if mode != "single":
        command += ["--standalone", "--nproc_per_node", "2"]
    command += ["-m", "benchmarks.bench_tp", "--worker", mode, folder, str(batch_size), str(length)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    root = Path(__file__).resolve().parents[1]
    result = subprocess.run(command, cwd=root, capture_output=True, text=True, env=env, timeout=1800)
    if result.returncode:
        raise RuntimeError(f"{mode} failed:\n{result.stderr[-3000:]}")
    ranks = sorted(
        (json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")), key=lambda r: r["rank"]
    )
    return {"step_seconds": max(r["step_seconds"] for r in ranks), "ranks": ranks}


def measure(layers: int, width: int, heads: int, vocab: int, batch: int, length: int) -> dict:
    import torch

    from aot_transformers import AoTConfig, AoTForCausalLM

    config = AoTConfig.from_preset(
        "aot-mssa-l-tiny", num_hidden_layers=layers, hidden_size=width, num_attention_heads=heads, vocab_size=vocab
    )
    torch.manual_seed(0)
    model = AoTForCausalLM(config)
    parameters = sum(p.numel() for p in model.parameters())
    with tempfile.TemporaryDirectory() as folder:
        model.save_pretrained(folder)
        del model
        modes = {mode: run_mode(mode, folder, batch, length) for mode in ("single", "dp", "tp")}
    dp, tp = modes["dp"], modes["tp"]

    def worst(mode: dict, key: str) -> float:
        return max(rank[key] for rank in mode["ranks"])

    summary = {
        "tp_over_dp_step_time": round(tp["step_seconds"] / dp["step_seconds"], 2),
        "tp_over_dp_peak_rss": round(worst(tp, "peak_rss_mb") / worst(dp, "peak_rss_mb"), 2),
        "tp_over_dp_peak_above_loaded": round(
            worst(tp, "peak_above_loaded_mb") / worst(dp, "peak_above_loaded_mb"), 2
        ),
    }
    return {"parameters": parameters, "modes": modes, "summary": summary}


def main() -> None:
    results = {name: {**settings, **measure(**settings)} for name, settings in SETTINGS.items()}
    path = write_results("tp", {"settings": results})
    print(json.dumps({name: result["summary"] for name, result in results.items()}), f"-> {path}")


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
    else:
        main()
