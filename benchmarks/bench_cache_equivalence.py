"""Cache and backend paths vs the uncached forward: the max |logit difference| of every path on every model.

    python -m benchmarks.bench_cache_equivalence                      # about a minute on 2 cores
    python -m benchmarks.bench_cache_equivalence --paths static-decode --models aot-mssa-knn3

Runs each path of `benchmarks/cache_paths.py` (the same runners `tests/test_cache_equivalence.py` asserts on) on
each tiny float32 model and records, per path × model, the largest |logit difference| from one uncached forward
over the same full sequence and where it occurred — or why the path did not run (needs CUDA) or the error it
raised. Writes `results/cache_equivalence.json` (with the transformers/torch versions and this command) and prints
a markdown table; a cell above the tolerance (1e-5) is marked ✗. For continuous batching the value compared is
each returned token's log-probability (transformers returns no logits there); a k-NN model must be refused there
with an error naming k-NN ("refused").
"""

from __future__ import annotations

import argparse
import time
import warnings

import torch

from ._common import invocation, setup, write_results
from .cache_paths import MODELS, NAMES_KNN, PATHS, TOLERANCE, PathUnavailable


def run_cell(path: str, model: str) -> dict:
    """One path on one model: the comparison, or why it did not run, or the error it raised."""
    start = time.perf_counter()
    try:
        result = PATHS[path].run(MODELS[model])
    except PathUnavailable as reason:
        return {"status": "unavailable", "reason": str(reason)}
    except Exception as error:  # recorded, not raised: the table shows every cell
        message = str(error).splitlines()[0] if str(error) else ""
        refused = MODELS[model].knn and isinstance(error, (ValueError, RuntimeError)) and NAMES_KNN.search(message)
        status = "refused" if refused else "error"  # a path that cannot serve k-NN must refuse it, by name
        return {"status": status, "error": f"{type(error).__name__}: {message}"[:400]}
    finally:
        torch._dynamo.reset()  # compiled paths: no cache of graphs across cells
    cell = {
        "status": "ok" if result.ok else "differs",
        "max_abs_logit_diff": result.max_diff,
        "where": result.where,
        "rows_compared": result.compared,
        "seconds": round(time.perf_counter() - start, 2),
    }
    if result.notes:
        cell["notes"] = result.notes
    return cell


def cell_text(cell: dict) -> str:
    if cell["status"] == "unavailable":
        return "n/a (CPU)" if "CUDA" in cell["reason"] else "n/a"
    if cell["status"] in ("error", "refused"):
        return f"{cell['status']} ({cell['error'].split(':')[0]})"
    mark = "" if cell["status"] == "ok" else " ✗"
    return f"{cell['max_abs_logit_diff']:.1e}{mark}"


def markdown_table(table: dict, models: list[str]) -> str:
    lines = ["| path | " + " | ".join(models) + " |", "|---" * (len(models) + 1) + "|"]
    for path, cells in table.items():
        lines.append(f"| {path} | " + " | ".join(cell_text(cells[m]) for m in models) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--paths", nargs="+", choices=list(PATHS), default=list(PATHS))
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    args = parser.parse_args(argv)
    setup()
    warnings.filterwarnings("ignore")  # deprecation chatter of transformers/torch; the table is the output
    table = {}
    for path in args.paths:
        table[path] = {model: run_cell(path, model) for model in args.models}
        print(f"{path}: " + ", ".join(f"{m} {cell_text(c)}" for m, c in table[path].items()), flush=True)
    failing = [
        {"path": path, "model": model, **cell}
        for path, cells in table.items()
        for model, cell in cells.items()
        if cell["status"] in ("differs", "error")
    ]
    results = {
        "tolerance": TOLERANCE,
        "paths": {name: PATHS[name].what for name in args.paths},
        "models": {name: MODELS[name].family for name in args.models},
        "table": table,
        "failing": failing,
    }
    path = write_results("cache_equivalence", results, invocation("benchmarks.bench_cache_equivalence", argv))
    print()
    print(markdown_table(table, args.models))
    print(f"\n{len(failing)} cells above {TOLERANCE:g} or failing; written to {path}")
    return results


if __name__ == "__main__":
    main()
