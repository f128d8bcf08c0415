"""k-NN attention: time and peak memory of the chunked kernel vs dense SDPA and the KVT reference recipe.

    python -m benchmarks.bench_knn               # timing at n=1024 and memory at n=1k..8k (about 5 minutes)
    python -m benchmarks.bench_knn --memory-one KERNEL N   # (internal) one memory measurement in this process

Shapes: batch 4, 4 heads x 64, k = 32, bidirectional, fp32, forward + backward.
The KVT recipe is the reference implementation's: full scores, `topk` indices, scatter into a zero mask,
`torch.where` to -inf, softmax, matmul (https://github.com/damo-cv/KVT).
"""

from __future__ import annotations

import argparse
import json

import torch

from aot_transformers.attention_aot import knn_attention_forward

from ._common import (
    current_rss_mb,
    interleaved_best_times,
    peak_rss_mb,
    reset_peak_rss,
    run_isolated,
    setup,
    write_results,
)

BATCH, HEADS, HEAD_DIM, K = 4, 4, 64, 32


def kvt_recipe(query, key, value, k):
    """The KVT reference top-k attention (dense scores and masks)."""
    scores = torch.matmul(query, key.transpose(-2, -1)) * HEAD_DIM**-0.5
    mask = torch.zeros_like(scores)
    index = torch.topk(scores, k=k, dim=-1, largest=True)[1]
    mask.scatter_(-1, index, 1.0)
    scores = torch.where(mask > 0, scores, torch.full_like(scores, float("-inf")))
    return torch.matmul(scores.softmax(dim=-1), value)


def kernels(n: int):
    q, k, v = (torch.randn(BATCH, HEADS, n, HEAD_DIM, requires_grad=True) for _ in range(3))
    grad = torch.randn(BATCH, HEADS, n, HEAD_DIM)

    def dense():
        torch.nn.functional.scaled_dot_product_attention(q, k, v).backward(grad)

    def knn():
        out, _ = knn_attention_forward(None, q, k, v, None, HEAD_DIM**-0.5, knn_k=K)
        out.transpose(1, 2).backward(grad)

    def kvt():
        kvt_recipe(q, k, v, K).backward(grad)

    return {"dense_sdpa": dense, "knn_chunked": knn, "kvt_reference": kvt}


def memory_one(kernel: str, n: int) -> dict:
    """Peak extra memory (MB) of one forward + backward of `kernel` at length n, in this fresh process."""
    setup()
    kernels(64)[kernel]()  # load the math libraries and thread pools before taking the baseline
    fns = kernels(n)
    reset_peak_rss()
    baseline = current_rss_mb()
    fns[kernel]()
    return {"kernel": kernel, "n": n, "peak_extra_mb": peak_rss_mb() - baseline}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--memory-one", nargs=2, metavar=("KERNEL", "N"))
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    if args.memory_one:
        print(json.dumps(memory_one(args.memory_one[0], int(args.memory_one[1]))))
        return {}
    setup()
    times = interleaved_best_times(kernels(1024), rounds=args.rounds)
    results = {
        "time_ms_n1024": {name: t * 1e3 for name, t in times.items()},
        "time_ratio_knn_vs_dense": times["knn_chunked"] / times["dense_sdpa"],
        "time_ratio_kvt_vs_dense": times["kvt_reference"] / times["dense_sdpa"],
    }
    print(results, flush=True)
    memory = {}
    for n in (1024, 2048, 4096, 8192):
        for kernel in ("knn_chunked", "dense_sdpa", "kvt_reference"):
            if kernel == "kvt_reference" and n > 4096:
                continue  # 8k needs several GB of dense scores; the trend is clear by 4k
            memory[f"{kernel}@{n}"] = run_isolated("bench_knn", "--memory-one", kernel, str(n))["peak_extra_mb"]
    results["peak_extra_mb"] = memory
    results["memory_ratio_knn_vs_kvt_n4096"] = memory["knn_chunked@4096"] / memory["kvt_reference@4096"]
    results["knn_memory_growth"] = {
        f"{n}->{2 * n}": memory[f"knn_chunked@{2 * n}"] / memory[f"knn_chunked@{n}"] for n in (1024, 2048, 4096)
    }
    print(results, flush=True)
    write_results("knn", results)
    return results


if __name__ == "__main__":
    main()
