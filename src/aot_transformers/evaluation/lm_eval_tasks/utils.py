"""Data loading and result processing for the aot_* lm-evaluation-harness tasks.

The documents come from `aot_transformers.evaluation`, the same code `aot eval lm` uses, so both tools score
identical texts. Where the data comes from is set with lm-eval's `--metadata` (a JSON object):

- `{"data_dir": "DIR"}`: the published file names are searched for under DIR (as `aot eval lm --data-dir`);
- `{"ptb": "PATH"}` (or any task/dataset name of `aot eval tasks`): one file, or `hub:REPO_ID[:CONFIG[:SPLIT]]`;
- neither: the environment variable `AOT_EVAL_DATA_DIR`, else the default Hub dataset.
"""

from __future__ import annotations

import os

import datasets

from aot_transformers.evaluation.tasks import (
    DATASETS,
    TASKS,
    count_words,
    lambada_split,
    load_source,
    resolve_sources,
)


def _load(task: str, metadata: dict) -> list:
    overrides = {key: value for key, value in metadata.items() if key in TASKS or key in DATASETS}
    data_dir = metadata.get("data_dir") or os.environ.get("AOT_EVAL_DATA_DIR") or None
    source = resolve_sources([task], data_dir, overrides)[TASKS[task].dataset]
    return load_source(source)


def _split(rows: list[dict]) -> dict[str, datasets.Dataset]:
    return {"test": datasets.Dataset.from_list(rows)}


def load_wikitext(**metadata) -> dict[str, datasets.Dataset]:
    """WikiText articles, one document each."""
    return _split([{"text": doc} for doc in _load("wikitext", metadata)])


def load_ptb(**metadata) -> dict[str, datasets.Dataset]:
    """The PTB split as one document."""
    return _split([{"text": doc} for doc in _load("ptb", metadata)])


def load_lambada_text(**metadata) -> dict[str, datasets.Dataset]:
    """LAMBADA passages as documents (language-modelling loss)."""
    return _split([{"text": doc} for doc in _load("lambada", metadata)])


def load_lambada(**metadata) -> dict[str, datasets.Dataset]:
    """LAMBADA passages split into context and ' ' + last word."""
    rows = []
    for passage in _load("lambada_acc", metadata):
        context, target = lambada_split(passage)
        rows.append({"text": passage, "context": context, "target": target})
    return _split(rows)


def _load_cbt(task: str, metadata: dict) -> dict[str, datasets.Dataset]:
    rows = []
    for example in _load(task, metadata):
        pairs = [example.scoring_pair(candidate) for candidate in example.candidates]
        rows.append(
            {
                "context": pairs[0][0],
                "choices": [continuation for _, continuation in pairs],
                "label": example.label,
                "question": example.question,
                "answer": example.answer,
            }
        )
    return _split(rows)


def load_cbt_cn(**metadata) -> dict[str, datasets.Dataset]:
    """CBT common nouns: context = story + question up to the blank; choices = candidate + rest of question."""
    return _load_cbt("cbt_cn", metadata)


def load_cbt_ne(**metadata) -> dict[str, datasets.Dataset]:
    """CBT named entities (as `load_cbt_cn`)."""
    return _load_cbt("cbt_ne", metadata)


def process_rolling_results(doc: dict, results: tuple[float]) -> dict:
    """Word and byte counts of the scored text itself, as `aot eval lm` counts them."""
    (loglikelihood,) = results
    num_bytes = len(doc["text"].encode("utf-8"))
    return {
        "word_perplexity": (loglikelihood, count_words(doc["text"])),
        "byte_perplexity": (loglikelihood, num_bytes),
        "bits_per_byte": (loglikelihood, num_bytes),
    }
