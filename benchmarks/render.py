"""The benchmark READMEs' numbers, read from the committed results files.

    python -m benchmarks.render            # rewrite every rendered table of the READMEs from the records
    python -m benchmarks.render --check    # exit 1 naming each README whose tables are not the records'

A table between `<!-- table NAME -->` and `<!-- /table -->` is written by `render` from the records (the function
`tables.TABLES[NAME]`); a number in the text is followed by its citation, `<!-- FILE: KEY -->`, a results file and a
key path in it. `tests/test_benchmark_readme_numbers.py` renders each README again and checks every cited number.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import re
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parent
REPO_ROOT = BENCHMARKS.parent
# The READMEs whose numbers come from the records, relative to the repository.
READMES = (
    "README.md",
    "benchmarks/README.md",
    "benchmarks/training/README.md",
    "benchmarks/eval/README.md",
    "benchmarks/results/experiments/README.md",
)

TABLE = re.compile(r"(<!-- table (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /table -->)", re.S)


def render(text: str) -> str:
    """`text` with every `<!-- table NAME -->` block rewritten by `tables.TABLES[NAME]` from the records."""
    from .tables import TABLES

    def rewrite(match: re.Match) -> str:
        name = match["name"]
        if name not in TABLES:
            raise KeyError(f"no table {name!r} in benchmarks/tables.py (known: {', '.join(sorted(TABLES))})")
        return f"{match.group(1)}{TABLES[name]().rstrip()}\n{match.group(4)}"

    return TABLE.sub(rewrite, text)


@functools.cache
def load(path: Path):
    """The record in `path`: a results file's JSON, or a benchmark module (for the settings it declares)."""
    if path.suffix == ".py":
        relative = path.resolve().relative_to(REPO_ROOT).with_suffix("")
        return importlib.import_module(".".join(relative.parts))
    return json.loads(path.read_text(encoding="utf-8"))


def readme_paths() -> list[Path]:
    """The READMEs that hold numbers from the records."""
    return [REPO_ROOT / name for name in READMES if (REPO_ROOT / name).is_file()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="report stale tables instead of rewriting them")
    args = parser.parse_args(argv)
    stale = []
    for path in readme_paths():
        text = path.read_text(encoding="utf-8")
        rendered = render(text)
        if rendered != text:
            stale.append(str(path.relative_to(REPO_ROOT)))
            if not args.check:
                path.write_text(rendered, encoding="utf-8")
    verb = "stale" if args.check else "rewritten"
    print(f"{verb}: {', '.join(stale)}" if stale else "every table is the records'")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
