"""The zero-shot suite of the AoT paper: tasks, where their data comes from, and how each number is computed.

| task          | data     | number                                                                           |
|---------------|----------|----------------------------------------------------------------------------------|
| `wikitext`    | WikiText | loss = mean token cross-entropy (nats), perplexity = exp(loss), bits per byte    |
| `ptb`         | PTB      | same                                                                             |
| `lambada`     | LAMBADA  | same, over whole passages                                                        |
| `lambada_acc` | LAMBADA  | accuracy: greedy decoding reproduces the whole last word (all of its tokens)     |
| `cbt_cn`      | CBT CN   | 10-way accuracy: the candidate whose filled-in question is the most likely       |
| `cbt_ne`      | CBT NE   | same                                                                             |

Data comes from a local file (`--data TASK=PATH`, or found by name under `--data-dir`) or from the Hub
(`hub:REPO_ID[:CONFIG[:SPLIT]]`, by default the dataset a user would pick online); both give identical documents.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .data import (
    ClozeExample,
    DataFormatError,
    EvaluationError,
    cloze_example,
    lambada_passages,
    ptb_documents,
    read_cbt,
    read_lambada,
    read_ptb,
    read_wikitext,
    wikitext_documents,
)
from .scoring import LanguageModelScorer

if TYPE_CHECKING:
    import datasets

HUB_PREFIX = "hub:"

CBT_RULE = (
    "argmax over the candidates of the total log-likelihood of 'candidate + rest of the question', given the "
    "20 story sentences and the question up to the blank (acc_norm divides by the continuation's characters)"
)
LAMBADA_RULE = (
    "correct when greedy decoding after the context yields every token of ' ' + last word (the last "
    "space-separated word of the passage)"
)
# What a task's runner returns: its metrics, the counts they come from, and details recorded beside them.
Outcome = tuple[dict[str, float], dict[str, int], dict[str, Any]]


@dataclass(frozen=True)
class HubSource:
    """A dataset on the Hugging Face Hub: repository, configuration, split and how its rows become our data."""

    path: str
    name: str | None
    split: str

    def describe(self) -> str:
        return HUB_PREFIX + ":".join(part for part in (self.path, self.name, self.split) if part)


@dataclass(frozen=True)
class Dataset:
    """One dataset of the suite and its two sources.

    Attributes:
        title: Human-readable name.
        read_file: Parser of the published local format.
        from_rows: Converts the Hub rows (a `datasets.Dataset`) into the same structure.
        hub: The default Hub source.
        file_names: File names looked for under `--data-dir`, best first (test split before validation).
        columns: Columns the Hub rows must have.
    """

    title: str
    read_file: Callable[[Path], list]
    from_rows: Callable[[Any, str], list]
    hub: HubSource
    file_names: tuple[str, ...]
    columns: tuple[str, ...]


def _text_dataset(
    title: str,
    read_file: Callable[[Path], list[str]],
    parse_lines: Callable[..., list[str]],
    hub: HubSource,
    file_names: tuple[str, ...],
    column: str,
) -> Dataset:
    """A dataset whose Hub rows hold its lines in one column (parsed as the local file's lines are)."""
    return Dataset(
        title, read_file, lambda rows, source: parse_lines(rows[column], source=source), hub, file_names, (column,)
    )


def _cbt_dataset(kind: str) -> Dataset:
    def from_rows(rows: datasets.Dataset, source: str) -> list[ClozeExample]:
        return [
            cloze_example(row["sentences"], row["question"], row["answer"], row["options"], source, number)
            for number, row in enumerate(rows, start=1)
        ]

    names = (f"cbtest_{kind}_test_2500ex.txt", f"cbtest_{kind}_valid_2000ex.txt", f"cbtest_{kind}_*.txt")
    columns = ("sentences", "question", "answer", "options")
    return Dataset(
        f"Children's Book Test ({kind})", read_cbt, from_rows, HubSource("cam-cst/cbt", kind, "test"), names, columns
    )


DATASETS: dict[str, Dataset] = {
    "wikitext": _text_dataset(
        "WikiText-2 (raw)",
        read_wikitext,
        wikitext_documents,
        HubSource("Salesforce/wikitext", "wikitext-2-raw-v1", "test"),
        ("wiki.test.raw", "wiki.valid.raw"),
        "text",
    ),
    "ptb": _text_dataset(
        "Penn Treebank",
        read_ptb,
        ptb_documents,
        HubSource("ptb-text-only/ptb_text_only", "penn_treebank", "test"),
        ("ptb.test.txt", "ptb.valid.txt"),
        "sentence",
    ),
    "lambada": _text_dataset(
        "LAMBADA (OpenAI)",
        read_lambada,
        lambada_passages,
        HubSource("EleutherAI/lambada_openai", "default", "test"),
        ("lambada_test.jsonl", "lambada_openai.jsonl", "lambada_dev*.jsonl"),
        "text",
    ),
    "cbt_cn": _cbt_dataset("CN"),
    "cbt_ne": _cbt_dataset("NE"),
}


@dataclass(frozen=True)
class Task:
    """One number of the suite.

    Attributes:
        name: Task name on the command line.
        dataset: Key of its dataset in `DATASETS`.
        kind: `"perplexity"` (mean token loss over documents), `"last_word"` (LAMBADA accuracy) or `"cloze"` (CBT).
        description: One line for `aot eval tasks`.
        lm_eval_task: The matching task of our lm-evaluation-harness folder.
    """

    name: str
    dataset: str
    kind: str
    description: str
    lm_eval_task: str


_LOSS = "loss (mean token cross-entropy)"
TASKS: dict[str, Task] = {
    task.name: task
    for task in (
        Task("wikitext", "wikitext", "perplexity", f"WikiText validation {_LOSS}", "aot_wikitext"),
        Task("ptb", "ptb", "perplexity", f"PTB validation {_LOSS}", "aot_ptb"),
        Task("lambada", "lambada", "perplexity", f"LAMBADA passages {_LOSS}", "aot_lambada_text"),
        Task("lambada_acc", "lambada", "last_word", "LAMBADA last-word accuracy, greedy decoding", "aot_lambada"),
        Task("cbt_cn", "cbt_cn", "cloze", "CBT common nouns, 10-way accuracy", "aot_cbt_cn"),
        Task("cbt_ne", "cbt_ne", "cloze", "CBT named entities, 10-way accuracy", "aot_cbt_ne"),
    )
}


def parse_task_names(tasks: str | Sequence[str] | None) -> list[str]:
    """Task names from a comma-separated string or a list (`all` or None: the whole suite), checked.

    Raises:
        EvaluationError: For an unknown name; the message lists the valid ones.
    """
    names = [name.strip() for name in (tasks.split(",") if isinstance(tasks, str) else tasks or []) if name.strip()]
    if not names or names == ["all"]:
        return list(TASKS)
    unknown = [name for name in names if name not in TASKS]
    if unknown:
        raise EvaluationError(f"unknown task(s) {unknown}; valid tasks: {', '.join(TASKS)} (or 'all').")
    return list(dict.fromkeys(names))


# --- Data sources.


@dataclass(frozen=True)
class DataSource:
    """Where one dataset is read from: a local file or a Hub dataset."""

    dataset: str
    path: Path | None = None
    hub: HubSource | None = None

    def to_dict(self) -> dict[str, Any]:
        if self.path is not None:
            return {"type": "file", "path": str(self.path)}
        return {"type": "hub", "path": self.hub.path, "name": self.hub.name, "split": self.hub.split}


def parse_source(dataset: str, spec: str | Path) -> DataSource:
    """A `DataSource` from a path or `hub:REPO_ID[:CONFIG[:SPLIT]]` (missing parts take the dataset's defaults)."""
    spec = str(spec)
    if spec.startswith(HUB_PREFIX):
        parts = spec[len(HUB_PREFIX) :].split(":")
        if not parts[0] or len(parts) > 3:
            raise EvaluationError(f"a Hub source looks like hub:REPO_ID[:CONFIG[:SPLIT]], got {spec!r}.")
        default = DATASETS[dataset].hub
        name = parts[1] if len(parts) > 1 and parts[1] else (default.name if parts[0] == default.path else None)
        split = parts[2] if len(parts) > 2 and parts[2] else default.split
        return DataSource(dataset, hub=HubSource(parts[0], name, split))
    return DataSource(dataset, path=Path(spec).expanduser())


def find_data_file(dataset: str, data_dir: str | Path) -> Path | None:
    """The file of `dataset` under `data_dir` (searched recursively), trying the known file names in order.

    Raises:
        EvaluationError: When one name matches several files (the message lists them).
    """
    root = Path(data_dir).expanduser()
    if not root.is_dir():
        raise EvaluationError(f"--data-dir {root} is not a directory.")
    for pattern in DATASETS[dataset].file_names:
        matches = sorted(root.rglob(pattern))
        if len(matches) == 1:
            return matches[0]
        if len(matches) > 1:
            listed = ", ".join(str(m) for m in matches)
            raise EvaluationError(
                f"several {dataset} files under {root}: {listed}; choose with --data {dataset}=PATH."
            )
    return None


def resolve_sources(
    tasks: Sequence[str], data_dir: str | Path | None = None, data: Mapping[str, str | Path] | None = None
) -> dict[str, DataSource]:
    """The source of each dataset the `tasks` (checked) need: `data[task or dataset]` (a path or
    `hub:REPO_ID[:CONFIG[:SPLIT]]`), else a file of a published name under `data_dir`, else the Hub."""
    overrides: dict[str, str | Path] = {}
    for key, spec in (data or {}).items():
        if key not in TASKS and key not in DATASETS:
            valid = ", ".join(dict.fromkeys([*TASKS, *DATASETS]))
            raise EvaluationError(f"--data names unknown task {key!r}; valid: {valid}.")
        dataset = TASKS[key].dataset if key in TASKS else key
        if dataset in overrides and str(overrides[dataset]) != str(spec):
            raise EvaluationError(f"two different sources for the {dataset} data: {overrides[dataset]} and {spec}.")
        overrides[dataset] = spec
    sources: dict[str, DataSource] = {}
    for key in dict.fromkeys(TASKS[name].dataset for name in parse_task_names(list(tasks))):
        if key in overrides:
            sources[key] = parse_source(key, overrides[key])
            continue
        found = find_data_file(key, data_dir) if data_dir is not None else None
        sources[key] = DataSource(key, path=found) if found else DataSource(key, hub=DATASETS[key].hub)
    return sources


def load_source(source: DataSource) -> list:
    """Read a dataset from its source into the structure its tasks expect (documents, passages or questions).

    Raises:
        DataFormatError: A file (or Hub rows) in the wrong format.
        EvaluationError: A missing file, or a Hub dataset that cannot be loaded (e.g. offline).
    """
    spec = DATASETS[source.dataset]
    if source.path is not None:
        return spec.read_file(source.path)
    try:
        import datasets
    except ImportError as error:
        raise EvaluationError(
            "loading from the Hub needs `datasets` (pip install 'aot-transformers[eval]'), or pass local files."
        ) from error
    hub = source.hub
    try:
        rows = datasets.load_dataset(hub.path, hub.name, split=hub.split)
    except Exception as error:  # network, missing config, script-only repos: all reported the same way
        raise EvaluationError(
            f"could not load {hub.describe()} for {source.dataset}: {type(error).__name__}: {error}. "
            f"Without internet, pass local files: --data-dir DIR or --data {source.dataset}=PATH "
            f"(published file names: {', '.join(spec.file_names)})."
        ) from None
    missing = [column for column in spec.columns if column not in rows.column_names]
    if missing:
        raise DataFormatError(hub.describe(), None, f"missing column(s) {missing}; the rows have {rows.column_names}")
    return spec.from_rows(rows, hub.describe())


# --- Running the tasks.


def count_words(text: str) -> int:
    """Words as lm-evaluation-harness counts them for word perplexity: `len(re.split(r"\\s+", text))`."""
    return len(re.split(r"\s+", text))


def lambada_split(passage: str) -> tuple[str, str]:
    """(context, target) of a LAMBADA passage: the target is ' ' + its last space-separated word."""
    context, word = passage.rsplit(" ", 1)
    return context, " " + word


@dataclass
class TaskResult:
    """Metrics of one task, with the counts they come from and where the data came from."""

    task: str
    metrics: dict[str, float]
    counts: dict[str, int]
    source: dict[str, Any]
    seconds: float
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.metrics,
            **self.counts,
            "seconds": round(self.seconds, 3),
            "source": self.source,
            **self.details,
        }


def _perplexity_metrics(scorer: LanguageModelScorer, documents: Sequence[str], name: str) -> Outcome:
    scores = scorer.rolling_loglikelihoods(documents, description=name)
    loglikelihood = sum(score.loglikelihood for score in scores)
    tokens = sum(score.num_tokens for score in scores)
    num_bytes = sum(len(doc.encode("utf-8")) for doc in documents)
    words = sum(count_words(doc) for doc in documents)
    if tokens == 0:
        raise EvaluationError(f"{name}: no token to score (empty documents?).")
    metrics = {
        "loss": -loglikelihood / tokens,
        "perplexity": math.exp(-loglikelihood / tokens),
        "bits_per_byte": -loglikelihood / (num_bytes * math.log(2)),  # compares models with different tokenizers
        "byte_perplexity": math.exp(-loglikelihood / num_bytes),
        "word_perplexity": math.exp(-loglikelihood / words),
    }
    counts = {"documents": len(documents), "tokens": tokens, "bytes": num_bytes, "words": words}
    return metrics, counts, {"loglikelihood": loglikelihood}


def _last_word_metrics(scorer: LanguageModelScorer, passages: Sequence[str], name: str) -> Outcome:
    scores = scorer.conditional_loglikelihoods([lambada_split(p) for p in passages], description=name)
    metrics = {
        "acc": sum(score.is_greedy for score in scores) / len(scores),
        "last_word_perplexity": math.exp(-sum(score.loglikelihood for score in scores) / len(scores)),
    }
    counts = {
        "examples": len(scores),
        "tokens": sum(score.num_tokens for score in scores),
        "multi_token_targets": sum(score.num_tokens > 1 for score in scores),
        "truncated_contexts": sum(score.truncated for score in scores),
    }
    return metrics, counts, {"rule": LAMBADA_RULE}


def _cloze_metrics(scorer: LanguageModelScorer, examples: Sequence[ClozeExample], name: str) -> Outcome:
    pairs = [example.scoring_pair(candidate) for example in examples for candidate in example.candidates]
    scores = scorer.conditional_loglikelihoods(pairs, description=name)
    correct = correct_norm = start = 0
    for example in examples:
        stop = start + len(example.candidates)
        lls = [score.loglikelihood for score in scores[start:stop]]
        normalised = [ll / len(continuation) for ll, (_, continuation) in zip(lls, pairs[start:stop], strict=True)]
        correct += max(range(len(lls)), key=lambda i: (lls[i], -i)) == example.label  # ties: the first candidate
        correct_norm += max(range(len(lls)), key=lambda i: (normalised[i], -i)) == example.label
        start = stop
    metrics = {"acc": correct / len(examples), "acc_norm": correct_norm / len(examples)}
    truncated = sum(score.truncated for score in scores)
    counts = {"examples": len(examples), "candidates": len(pairs), "truncated_contexts": truncated}
    return metrics, counts, {"rule": CBT_RULE}


_RUNNERS = {"perplexity": _perplexity_metrics, "last_word": _last_word_metrics, "cloze": _cloze_metrics}


def run_task(scorer: LanguageModelScorer, task: str, data: Sequence, source: DataSource | None = None) -> TaskResult:
    """Compute the metrics of `task` (a name of `TASKS`; see the module docstring for each number) with `scorer` on
    `data` as `load_source` returns it (possibly cut with `limit`); `source` is recorded in the result."""
    spec = TASKS[parse_task_names([task])[0]]
    if not data:
        raise EvaluationError(f"{task}: no data to evaluate.")
    start = time.perf_counter()
    metrics, counts, details = _RUNNERS[spec.kind](scorer, data, task)
    seconds = time.perf_counter() - start
    return TaskResult(task, metrics, counts, source.to_dict() if source else {}, seconds, details)
