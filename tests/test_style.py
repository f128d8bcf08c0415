"""The code base stays lint-clean and formatted (ruff, configured in pyproject.toml)."""

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _ruff():
    exe = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    if not Path(exe).exists():
        pytest.skip("ruff is not installed (it comes with the dev extra)")
    return exe


@pytest.mark.parametrize("command", [["check"], ["format", "--check"]], ids=["lint", "format"])
def test_ruff(command):
    result = subprocess.run([_ruff(), *command, "."], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, f"`ruff {' '.join(command)} .` failed:\n{result.stdout}{result.stderr}"


def test_tests_import_their_helpers_from_the_support_module_and_never_edit_sys_path():
    # `tests/` and the repository root are on pytest's `pythonpath`: `from support import ...`, `from benchmarks...`.
    # Code the tests run in a subprocess (a string) may set its own path.
    offenders = []
    for path in sorted((ROOT / "tests").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            imports_conftest = isinstance(node, ast.ImportFrom) and node.module == "conftest"
            imports_conftest |= isinstance(node, ast.Import) and any(a.name == "conftest" for a in node.names)
            edits_path = isinstance(node, ast.Call) and ast.unparse(node.func) in (
                "sys.path.insert",
                "sys.path.append",
            )
            if imports_conftest or edits_path:
                offenders.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    assert not offenders, "\n".join(offenders)


def test_what_the_tests_import_from_benchmarks_the_benchmarks_use_too():
    # Code only the tests use belongs with them (tests/support.py or the test), not in benchmarks/.
    used = set()
    for path in (ROOT / "benchmarks").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                used.add(node.id)
            elif isinstance(node, ast.Attribute):
                used.add(node.attr)
            elif isinstance(node, ast.ImportFrom):
                used |= {alias.name for alias in node.names}
    only_tests = []
    for path in sorted((ROOT / "tests").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("benchmarks"):
                module = ROOT.joinpath(*node.module.split("."))
                if module.with_suffix(".py").is_file() or (module / "__init__.py").is_file():
                    only_tests += [f"{path.name}: {node.module}.{a.name}" for a in node.names if a.name not in used]
    assert not only_tests, "\n".join(only_tests)
