"""The benchmark READMEs' numbers, read from the committed results files.

    python -m benchmarks.render            # rewrite every rendered table of the READMEs from the records
    python -m benchmarks.render --check    # exit 1 naming each README whose tables are not the records'

A README number is tied to the key it comes from in one of two ways, and `tests/test_benchmark_readme_numbers.py`
checks both:

- A table between `<!-- table NAME -->` and `<!-- /table -->` is written by `render` from the records (the function
  `tables.TABLES[NAME]`); the test renders each README again and compares.
- A number in the text is followed by its citation, `<!-- FILE: KEY -->`, where FILE is a results file relative to the
  README's folder (or a benchmark module, `.py`, for a setting) and KEY a key path in it: keys joined by dots, a key
  holding dots, spaces or colons in double quotes (`modes."aot serve".seconds`), an integer for a list item; or
  arithmetic of such paths and numbers, with spaces around each operator (`a / b * 100`); a path to a list or a
  mapping stands for its length (`memory.DDP.ranks`: the number of ranks). The number must be the value at the
  precision printed.
"""

from __future__ import annotations

import argparse
import ast
import functools
import importlib
import json
import operator
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
CITATION = re.compile(r"<!-- (?P<file>[\w./-]+\.(?:json|py)): (?P<key>.+?) -->")
# A token of a citation's KEY: an operator, a number or a key path (quoted parts may hold spaces).
TOKEN = re.compile(r'(?:"[^"]*"|[^\s"])+')
OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


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


def lookup(record, path: str):
    """The value at the key path `path` (see the module docstring) of `record`."""
    value = record
    for part in re.findall(r'"[^"]*"|[^."]+', path):
        key = part.strip('"')
        if isinstance(value, dict):
            value = value[key]
        elif isinstance(value, (list, tuple)):
            value = value[int(key)]
        else:
            value = getattr(value, key)
    return value


def evaluate(expression: str, record) -> float:
    """The value of a citation's KEY: a key path, or arithmetic of key paths and numbers."""
    names: dict[str, float] = {}
    tokens = []
    for token in TOKEN.findall(expression):
        if token in ("+", "-", "*", "/", "(", ")") or re.fullmatch(r"\d+(?:\.\d+)?(?:e-?\d+)?", token):
            tokens.append(token)
        else:
            found = lookup(record, token)
            names[f"_{len(names)}"] = len(found) if isinstance(found, (list, tuple, dict)) else found
            tokens.append(f"_{len(names) - 1}")
    tree = ast.parse(" ".join(tokens), mode="eval")

    def value(node: ast.AST) -> float:
        if isinstance(node, ast.Expression):
            return value(node.body)
        if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
            return OPERATORS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.Name):
            return names[node.id]
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        raise ValueError(f"not a key path or arithmetic: {expression!r}")

    return value(tree)


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
