"""The project never triggers transformers' remote-code prompt for its own folders.

Root cause: in transformers 5 `AutoTokenizer.from_pretrained(folder)` first loads the folder's `config.json` through
`AutoConfig`; a saved AoT folder's config has an `auto_map` (the model is remote code), so whenever the model type is
not registered in the process and `trust_remote_code` is not given, transformers asks on the terminal and waits 15 s.
Every tokenizer load of `training/` and `evaluation/` passes `trust_remote_code=False` (a tokenizer.json needs no
code; the package registers `aot`), so none asks. Each case runs in a fresh interpreter with stdin closed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("tokenizers")

from aot_transformers import AoTForCausalLM, export_model
from aot_transformers.training.lm import train_bpe_tokenizer
from support import tiny_config

PROMPT = "Do you wish to run the custom code"


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("prompt")
    tokenizer = train_bpe_tokenizer(["to be or not to be"] * 20, vocab_size=300, show_progress=False)
    own = export_model(AoTForCausalLM(tiny_config(vocab_size=300)), root / "aot", tokenizer=tokenizer)
    # A folder of a model type nobody registered, with remote code: the package's loaders must not ask either.
    foreign = export_model(AoTForCausalLM(tiny_config(vocab_size=300)), root / "foreign", tokenizer=tokenizer)
    config = json.loads((foreign / "config.json").read_text())
    config["model_type"] = "someone-elses-model"
    (foreign / "config.json").write_text(json.dumps(config))
    return own, foreign


def run_fresh(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )


def test_plain_auto_tokenizer_asks_for_remote_code(folders):
    """The control: what a saved folder does to `AutoTokenizer` without the package and without the flag."""
    own, _ = folders
    done = run_fresh(f"from transformers import AutoTokenizer; AutoTokenizer.from_pretrained({str(own)!r})")
    assert PROMPT in done.stdout + done.stderr


@pytest.mark.parametrize("which", ["own", "foreign"])
def test_training_and_evaluation_tokenizer_loads_never_ask(folders, which):
    folder = str(folders[0] if which == "own" else folders[1])
    done = run_fresh(
        f"""
        from aot_transformers.training.lm import load_tokenizer
        from aot_transformers.evaluation.runner import load_model_and_tokenizer
        assert len(load_tokenizer({folder!r})) >= 256
        if {which!r} == "own":
            model, tokenizer = load_model_and_tokenizer({folder!r})
            assert len(tokenizer) >= 256
        print("loaded")
        """
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "loaded" in done.stdout and PROMPT not in done.stdout + done.stderr
