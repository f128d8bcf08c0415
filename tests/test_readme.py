"""The README's ecosystem section runs as written: its Python blocks, in order, in one fresh interpreter."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from support import REPO_ROOT

SECTION = "## Using AoT with the rest of the ecosystem"


def section_code(readme: str, heading: str) -> str:
    """The Python code blocks of the README section under `heading`, joined in order."""
    start = readme.index(heading)
    end = readme.find("\n## ", start + len(heading))
    body = readme[start : end if end != -1 else None]
    body = body.split("### Export (torch.export, ONNX)")[0]  # its shell + Python steps: tests/test_onnx_export.py
    blocks = re.findall(r"```python\n(.*?)```", body, flags=re.DOTALL)
    assert blocks, f"no Python block under {heading!r}"
    return "\n".join(blocks)


def test_the_ecosystem_section_runs(tmp_path):
    code = section_code((REPO_ROOT / "README.md").read_text(), SECTION)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(tmp_path / "modules")}
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]


def test_the_tested_versions_the_readme_names_are_the_pinned_ones():
    text = (REPO_ROOT / "README.md").read_text()
    start = text.index("(`constraints.txt`:")
    named = re.findall(r"([A-Za-z][\w-]*) (\d+(?:\.\d+)+)", text[start : text.index(")", start)])
    lines = (REPO_ROOT / "constraints.txt").read_text().splitlines()
    pins = dict(
        line.split(";")[0].strip().split("==", 1) for line in lines if "==" in line and not line.startswith("#")
    )
    pins = {name.lower().replace("_", "-"): version.split("+")[0] for name, version in pins.items()}
    assert len(named) >= 6
    for name, version in named:
        if name != "Python":
            assert pins[name.lower().replace("_", "-")] == version, name
