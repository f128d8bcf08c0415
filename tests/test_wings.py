"""The package's layering: the wings (`training/`, `evaluation/`, `experiments/`) and `hub.py` import no other wing;
what two of them share lives at package level (`_io.py`, `model_card.py`, ...)."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import aot_transformers
from aot_transformers.modeling_aot import CODE_FILES
from support import REPO_ROOT

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


# Imports every module of the package after snapshotting every attribute of every transformers module (and of every
# class defined in one) that importing them loads; prints what changed. Registries (Auto classes, attention
# functions) are filled through their public `register`, which changes no attribute.
PATCH_PROBE = """
import importlib, inspect, pkgutil, sys
for name in sys.argv[1:]:  # in the order the package loaded them
    try:
        importlib.import_module(name)
    except Exception:  # loaded inside a try by transformers itself; what then loads it is compared from there on
        pass
def snapshot():
    seen = {}
    for module_name, module in list(sys.modules.items()):
        if not module_name.startswith("transformers") or module is None:
            continue
        lazy = type(module).__name__ == "_LazyModule"  # caches what it imports on first access: not a change
        for attr, value in list(vars(module).items()):
            seen[(module_name, attr)] = (id(value), lazy)
            if inspect.isclass(value) and value.__module__ == module_name:
                for cls_attr, cls_value in list(vars(value).items()):
                    seen[(f"{module_name}.{attr}", cls_attr)] = (id(cls_value), False)
    return seen
before = snapshot()
owners = {owner for owner, _ in before}
import aot_transformers
for info in pkgutil.walk_packages(aot_transformers.__path__, "aot_transformers."):
    if not info.name.endswith("_reload_check"):  # a script for its own process: it hides the package
        importlib.import_module(info.name)
for key, (identity, lazy) in sorted(snapshot().items()):
    if key in before and before[key][0] != identity or key not in before and key[0] in owners and not lazy:
        print(".".join(key))
"""


@pytest.fixture(scope="module")
def transformers_modules() -> list[str]:
    """The transformers modules importing every module of the package loads, in the order it loads them."""
    code = (
        "import importlib, pkgutil, sys, aot_transformers\n"
        "for info in pkgutil.walk_packages(aot_transformers.__path__, 'aot_transformers.'):\n"
        "    if not info.name.endswith('_reload_check'):\n"
        "        importlib.import_module(info.name)\n"
        "print(' '.join(n for n in sys.modules if n.startswith('transformers')))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return result.stdout.split()


def test_importing_any_module_of_the_package_changes_no_transformers_class_or_module_attribute(transformers_modules):
    command = [sys.executable, "-c", PATCH_PROBE, *transformers_modules]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "", f"importing aot_transformers changed:\n{result.stdout}"


def test_the_patch_probe_sees_a_replaced_method_and_a_new_class_attribute(tmp_path, transformers_modules):
    patch = tmp_path / "patcher.py"
    patch.write_text(
        "import transformers\n"
        "transformers.PreTrainedModel.save_pretrained = lambda self, *a, **k: None\n"
        "transformers.PretrainedConfig.knn_k = None\n"
    )
    probe = PATCH_PROBE.replace("import aot_transformers\n", "import patcher, aot_transformers\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run(
        [sys.executable, "-c", probe, *transformers_modules],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    changed = set(result.stdout.split())
    assert "transformers.modeling_utils.PreTrainedModel.save_pretrained" in changed
    assert "transformers.configuration_utils.PreTrainedConfig.knn_k" in changed
    assert all(name.endswith((".save_pretrained", ".knn_k")) for name in changed), changed  # and nothing else


def test_the_remote_code_unit_is_at_most_1000_lines_and_its_size_record_counts_todays_files():
    record = json.loads((REPO_ROOT / "benchmarks" / "results" / "unit_size.json").read_text(encoding="utf-8"))
    lines = {name: len((PACKAGE / name).read_text(encoding="utf-8").splitlines()) for name in CODE_FILES}
    assert lines == record["unit_lines"], "the unit changed: run `python -m benchmarks.unit_size`"
    assert record["unit_total"] == sum(lines.values()) <= 1_000
