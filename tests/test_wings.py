"""The package's layering: the wings (`training/`, `evaluation/`, `experiments/`) and `hub.py` import no other wing;
what two of them share lives at package level (`_io.py`, `model_card.py`, ...)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import aot_transformers

PACKAGE = Path(aot_transformers.__file__).parent
WINGS = ("training", "evaluation", "experiments")


def imported_modules(source: str, module: str) -> set[str]:
    """Every `aot_transformers...` module the code `source` of `module` imports (relative imports resolved), at any
    depth of the file (imports inside functions too)."""
    parts = module.split(".")
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(parts[: len(parts) - node.level]) if node.level else ""
            module = ".".join(filter(None, [base, node.module or ""]))
            found |= {module} | {f"{module}.{alias.name}" for alias in node.names}
    return {name for name in found if name.split(".")[0] == "aot_transformers"}


def wing_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in WINGS else None


def test_no_wing_and_not_hub_imports_another_wing():
    crossings = []
    for path in sorted(PACKAGE.rglob("*.py")):
        own = path.relative_to(PACKAGE).parts[0]
        if own not in WINGS and path.name != "hub.py":
            continue
        name = ".".join(["aot_transformers", *path.relative_to(PACKAGE).with_suffix("").parts])
        for module in imported_modules(path.read_text(encoding="utf-8"), name):
            if wing_of(module) not in (None, own):
                crossings.append(f"{path.relative_to(PACKAGE)} imports {module}")
    assert crossings == []


def test_the_rule_sees_relative_absolute_and_late_imports():
    source = "from ..evaluation import tasks\nimport aot_transformers.experiments.cli\ndef f():\n  from .. import hub"
    found = imported_modules(source, "aot_transformers.training.probe")
    assert {"aot_transformers.evaluation.tasks", "aot_transformers.experiments.cli", "aot_transformers.hub"} <= found
    assert {wing_of(name) for name in found} == {"evaluation", "experiments", None}


def test_importing_the_package_imports_no_wing():
    code = "import sys, aot_transformers; print(sorted(m for m in sys.modules if m.startswith('aot_transformers.')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True).stdout
    loaded = eval(out)
    assert "aot_transformers.hub" in loaded  # export_model: the package-level modules hub.py imports are loaded
    assert [name for name in loaded if wing_of(name)] == []


def test_the_cards_names_of_the_suite_are_the_suites_own():
    from aot_transformers.evaluation.tasks import DATASETS, TASKS
    from aot_transformers.model_card import SUITE

    datasets = {name: DATASETS[task.dataset] for name, task in TASKS.items()}
    assert SUITE == {name: (task.kind, datasets[name].title, datasets[name].hub.path) for name, task in TASKS.items()}
