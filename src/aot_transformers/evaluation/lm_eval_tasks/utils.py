"""Data loading and result processing for the aot_* lm-evaluation-harness tasks.

The documents come from `aot_transformers.evaluation`, the same code `aot eval lm` uses, so both tools score
identical texts. Where the data comes from is set with lm-eval's `--metadata` (a JSON object):

- `{"data_dir": "DIR"}`: the published file names are searched for under DIR (as `aot eval lm --data-dir`);
- `{"ptb": "PATH"}` (or any task/dataset name of `aot eval tasks`): one file, or `hub:REPO_ID[:CONFIG[:SPLIT]]`;
- neither: the environment variable `AOT_EVAL_DATA_DIR`, else the default Hub dataset.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import datasets

from aot_transformers.evaluation.data import ClozeExample
from aot_transformers.evaluation.tasks import (
    DATASETS,
    TASKS,
    count_words,
    lambada_split,
    load_source,
    resolve_sources,
)


def _loader(
    task: str, row: Callable[[Any], dict] = lambda document: {"text": document}
) -> Callable[..., dict[str, datasets.Dataset]]:
    """The `custom_dataset` of `task`'s YAML: its data (from the source `metadata` names; see the module docstring),
    one `row(item)` each, as lm-eval's test split."""

    def load(**metadata) -> dict[str, datasets.Dataset]:
        overrides = {key: value for key, value in metadata.items() if key in TASKS or key in DATASETS}
        data_dir = metadata.get("data_dir") or os.environ.get("AOT_EVAL_DATA_DIR") or None
        source = resolve_sources([task], data_dir, overrides)[TASKS[task].dataset]
        return {"test": datasets.Dataset.from_list([row(item) for item in load_source(source)])}

    return load


def _lambada_row(passage: str) -> dict:
    """A LAMBADA passage split into context and ' ' + last word."""
    context, target = lambada_split(passage)
    return {"text": passage, "context": context, "target": target}


def _cbt_row(example: ClozeExample) -> dict:
    """A CBT question: context = story + question up to the blank; choices = candidate + rest of question."""
    pairs = [example.scoring_pair(candidate) for candidate in example.candidates]
    return {
        "context": pairs[0][0],
        "choices": [continuation for _, continuation in pairs],
        "label": example.label,
        "question": example.question,
        "answer": example.answer,
    }


load_wikitext = _loader("wikitext")  # WikiText articles, one document each
load_ptb = _loader("ptb")  # the PTB split as one document
load_lambada_text = _loader("lambada")  # LAMBADA passages as documents (language-modelling loss)
load_lambada = _loader("lambada_acc", _lambada_row)
load_cbt_cn = _loader("cbt_cn", _cbt_row)  # common nouns
load_cbt_ne = _loader("cbt_ne", _cbt_row)  # named entities


def process_rolling_results(doc: dict, results: tuple[float]) -> dict:
    """Word and byte counts of the scored text itself, as `aot eval lm` counts them."""
    (loglikelihood,) = results
    num_bytes = len(doc["text"].encode("utf-8"))
    return {
        "word_perplexity": (loglikelihood, count_words(doc["text"])),
        "byte_perplexity": (loglikelihood, num_bytes),
        "bits_per_byte": (loglikelihood, num_bytes),
    }
