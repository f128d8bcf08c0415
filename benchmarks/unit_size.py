"""Lines of the remote-code unit (the three files every saved model folder carries), next to transformers' Llama.

python -m benchmarks.unit_size      # -> results/unit_size.json
"""

from __future__ import annotations

import argparse
from pathlib import Path

import transformers

import aot_transformers

from ._common import write_results

UNIT = ("configuration_aot.py", "attention_aot.py", "modeling_aot.py")
LLAMA = ("configuration_llama.py", "modeling_llama.py")


def _lines(folder: Path, names: tuple[str, ...]) -> dict[str, int]:
    return {name: len((folder / name).read_text().splitlines()) for name in names}


def main() -> dict:
    unit = _lines(Path(aot_transformers.__file__).parent, UNIT)
    llama = _lines(Path(transformers.__file__).parent / "models" / "llama", LLAMA)
    results = {
        "unit_lines": unit,
        "unit_total": sum(unit.values()),
        "llama_lines": llama,
        "llama_total": sum(llama.values()),
        "transformers": transformers.__version__,
    }
    print(results)
    write_results("unit_size", results)
    return results


if __name__ == "__main__":
    argparse.ArgumentParser(prog="python -m benchmarks.unit_size", description=__doc__.split("\n")[0]).parse_args()
    main()
