"""The code base stays lint-clean and formatted (ruff, configured in pyproject.toml)."""

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
