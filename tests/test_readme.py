"""The README's ecosystem section and its TRL section run as written: each section's Python blocks, in order, in one
fresh interpreter."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from support import REPO_ROOT

SECTION = "## Using AoT with the rest of the ecosystem"
TRL_SECTION = "### Post-training with TRL (SFT, DPO, GRPO)"


def section_code(readme: str, heading: str) -> str:
    """The Python code blocks of the README section under `heading`, joined in order."""
    start = readme.index(heading)
    end = readme.find("\n## ", start + len(heading))
    body = readme[start : end if end != -1 else None]
    body = body.split("### Export (torch.export, ONNX)")[0]  # its shell + Python steps: tests/test_onnx_export.py
    blocks = re.findall(r"```python\n(.*?)```", body, flags=re.DOTALL)
    assert blocks, f"no Python block under {heading!r}"
    return "\n".join(blocks)


def pinned_versions() -> dict[str, str]:
    """constraints.txt as {normalized name: version} (a local suffix such as +cpu dropped)."""
    lines = (REPO_ROOT / "constraints.txt").read_text().splitlines()
    pins = dict(
        line.split(";")[0].strip().split("==", 1) for line in lines if "==" in line and not line.startswith("#")
    )
    return {name.lower().replace("_", "-"): version.split("+")[0] for name, version in pins.items()}


def test_the_ecosystem_section_runs(tmp_path):
    code = section_code((REPO_ROOT / "README.md").read_text(), SECTION)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(tmp_path / "modules")}
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]


def test_the_trl_section_runs_sft_dpo_and_grpo(tmp_path, shared_data):
    pytest.importorskip("trl")
    readme = (REPO_ROOT / "README.md").read_text()
    code = section_code(readme, TRL_SECTION)
    assert all(f"{name}Trainer(" in code and f"{name.lower()}.train()" in code for name in ("SFT", "DPO", "GRPO"))
    assert f"tested with trl {pinned_versions()['trl']}" in readme  # the version the section names is the pinned one
    (tmp_path / "shared").symlink_to(shared_data.parent)  # ../shared/data from the working folder, as in the README
    (tmp_path / "work").mkdir()
    code += "\nprint('trained:', *(type(t).__name__ for t in (sft, dpo, grpo)))"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(tmp_path / "modules")}
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path / "work", env=env, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "trained: SFTTrainer DPOTrainer GRPOTrainer" in result.stdout
    assert (tmp_path / "work" / "aot-dpo" / "model.safetensors").is_file()


def test_the_tested_versions_the_readme_names_are_the_pinned_ones():
    text = (REPO_ROOT / "README.md").read_text()
    start = text.index("(`constraints.txt`:")
    named = re.findall(r"([A-Za-z][\w-]*) (\d+(?:\.\d+)+)", text[start : text.index(")", start)])
    pins = pinned_versions()
    assert len(named) >= 6
    for name, version in named:
        if name != "Python":
            assert pins[name.lower().replace("_", "-")] == version, name
