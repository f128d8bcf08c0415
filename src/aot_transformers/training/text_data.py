"""Text data for causal-LM training: Hub datasets, local files and folders, streaming, the embedded corpus, and
packing of token blocks."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._io import arg, is_hub_id
from .arguments import TrainingSetupError, check_dataset_name, load_hub_dataset

# File suffix -> `datasets` builder.
TEXT_BUILDERS = {
    **dict.fromkeys((".txt", ".text", ".md"), "text"),
    **dict.fromkeys((".json", ".jsonl"), "json"),
    ".parquet": "parquet",
    ".csv": "csv",
}
EMBEDDED_CORPUS = "pydoc-topics"


@dataclass
class TextDataArguments:
    """Where the training text comes from and how it becomes blocks of tokens."""

    dataset_name: str | None = arg(
        None,
        "A Hub dataset id, a local file or folder (txt/json/jsonl/parquet/csv), or "
        f"'{EMBEDDED_CORPUS}' (Python's own documentation text, no download). Default: {EMBEDDED_CORPUS}.",
    )
    dataset_config_name: str | None = arg(None, "Config name of a Hub dataset.")
    train_file: list[str] | None = arg(None, "Local training files or folders (instead of --dataset_name).")
    validation_file: list[str] | None = arg(
        None, "Local validation files or folders (default: split off the training data)."
    )
    train_split: str = arg("train", "Split of a Hub dataset to train on.")
    validation_split: str = arg("validation", "Split of a Hub dataset to validate on, when it has one.")
    text_column: str = arg("text", "Column holding the text.")
    validation_split_percentage: float = arg(
        5.0, "Share of the training examples held out for validation (the last ones)."
    )
    block_size: int | None = arg(None, "Tokens per training block (default: min(512, max_position_embeddings)).")
    streaming: bool = arg(False, "Stream the data (files larger than memory); needs --max_steps.")
    streaming_validation_examples: int = arg(
        200, "With --streaming and no validation data: hold out this many examples."
    )
    max_train_samples: int | None = arg(None, "Use at most this many training blocks.")
    max_eval_samples: int | None = arg(None, "Use at most this many validation blocks.")
    preprocessing_num_workers: int | None = arg(None, "Processes for tokenization.")


@dataclass
class TextSource:
    """Loaded raw text splits and how to describe them in the model card."""

    train: Any
    validation: Any
    description: str
    hub_ids: list[str]
    documents: bool  # examples are whole documents (separate them with EOS) rather than lines
    name: str = "custom"  # the dataset's name in the model card's model-index


def _looks_local(name: str) -> bool:
    """A path, an existing file or folder, or not a Hub id; a Hub id ending in a data-file suffix counts as a file."""
    return not is_hub_id(name) or Path(name).suffix.lower() in TEXT_BUILDERS or name.endswith(".gz")


def collect_files(paths: list[str], what: str = "training") -> dict[str, list[str]]:
    """Local files grouped by `datasets` builder; folders are searched recursively. Raises `TrainingSetupError`
    for a missing path, an unsupported suffix, or a folder with no usable file."""
    grouped: dict[str, list[str]] = {}
    for raw in paths:
        path = Path(raw).expanduser()
        if not path.exists():
            raise TrainingSetupError(f"{what} data: no such file or folder: {raw}.")
        if path.is_dir():
            found = sorted(
                p
                for p in path.rglob("*")
                if p.is_file() and p.suffix.lower() in TEXT_BUILDERS and not p.name.startswith(".")
            )
            if not found:
                raise TrainingSetupError(f"{what} data: folder {raw} has no {'/'.join(sorted(TEXT_BUILDERS))} files.")
        else:
            if path.suffix.lower() not in TEXT_BUILDERS:
                raise TrainingSetupError(
                    f"{what} data: {raw} has an unsupported suffix; use one of {sorted(TEXT_BUILDERS)}."
                )
            found = [path]
        for file in found:
            grouped.setdefault(TEXT_BUILDERS[file.suffix.lower()], []).append(str(file))
    return grouped


def check_text_file(path: str | os.PathLike, text_column: str = "text", what: str = "training") -> None:
    """Read a local text, JSON Lines or CSV file once and refuse what `datasets` would choke on, naming the file and
    the line: an empty file, bytes that are not UTF-8 (latin-1, UTF-16, binary data), a JSON line that is not a JSON
    object, or a record whose `text_column` is missing, null or not a string. Raises `TrainingSetupError` for the
    first problem found (exit code 2, before anything is tokenized)."""
    path = Path(path)
    builder = TEXT_BUILDERS.get(path.suffix.lower())

    def refuse(problem: str) -> TrainingSetupError:
        return TrainingSetupError(f"{what} data: {path} {problem}")

    if builder not in ("text", "json", "csv"):
        return  # parquet carries its own schema; `datasets` reports its errors with the file name
    if path.stat().st_size == 0:
        raise refuse("is empty.")
    with open(path, "rb") as handle:
        head = handle.read(4)
    if head[:2] in (b"\xff\xfe", b"\xfe\xff"):
        raise refuse("is UTF-16 text; convert it to UTF-8 (e.g. with iconv).")
    if builder == "json" and head[:1] == b"[" and path.suffix.lower() == ".json":
        return  # one JSON document (not JSON Lines): `datasets` parses it as a whole
    records = 0
    has_text = builder == "csv"  # a CSV's text column is checked by `datasets`, not here
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, start=1):
            if b"\x00" in raw:
                raise refuse(f"line {number} holds NUL bytes: a binary file, not text.")
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as error:
                raise refuse(
                    f"line {number} is not UTF-8 (byte {raw[error.start]:#04x} at column {error.start + 1}); "
                    "convert the file to UTF-8 (e.g. iconv -f latin1 -t utf-8)."
                ) from None
            if builder != "json" or not line.strip():
                has_text = has_text or bool(line.strip())
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise refuse(
                    f"line {number} is not valid JSON ({error.msg}); each line must be one JSON object."
                ) from None
            if not isinstance(record, dict):
                raise refuse(f"line {number} is a JSON {type(record).__name__}, not an object.")
            if text_column not in record:
                raise refuse(
                    f"line {number} has no text column {text_column!r} (fields: {sorted(record)[:10]}); choose one "
                    "with --text_column."
                )
            value = record[text_column]
            if not isinstance(value, str):
                raise refuse(
                    f"line {number}: the text column {text_column!r} holds {type(value).__name__} {value!r:.40}, "
                    "not a string."
                )
            records += 1
            has_text = has_text or bool(value.strip())
    if builder == "json" and records == 0:
        raise refuse("holds no JSON records.")
    if not has_text:
        raise refuse("holds only whitespace: no text to train on.")


def _load_local(paths: list[str], text_column: str, streaming: bool, what: str):
    import datasets

    parts = []
    for builder, files in collect_files(paths, what).items():
        for file in files:
            check_text_file(file, text_column, what)
        kwargs = {"keep_linebreaks": True} if builder == "text" else {}
        part = datasets.load_dataset(builder, data_files=files, split="train", streaming=streaming, **kwargs)
        check_text_column(part, text_column, f"{what} files {files[:3]}{'…' if len(files) > 3 else ''}")
        parts.append(part.select_columns([text_column]))
    return parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)


def embedded_corpus() -> list[str]:
    """Python's `pydoc_data.topics` (about 465 KB of English documentation, in every CPython), one topic each."""
    from pydoc_data.topics import topics

    return [topics[key] for key in sorted(topics)]


def column_names(dataset) -> list[str]:
    """Columns of a `Dataset` or `IterableDataset` (peeking at the first example when the features are unknown)."""
    names = getattr(dataset, "column_names", None)
    return list(names if names is not None else next(iter(dataset), {}))


def check_text_column(dataset, text_column: str, where: str) -> None:
    """Raise `TrainingSetupError` when `dataset` has no `text_column`."""
    names = column_names(dataset)
    if text_column not in names:
        raise TrainingSetupError(
            f"{where} has no text column {text_column!r} (columns: {names}); choose one with --text_column."
        )


def load_text_source(args: TextDataArguments) -> TextSource:
    """Load the raw training and validation text described by `args` (nothing is tokenized yet)."""
    import datasets

    if args.dataset_name and args.train_file:
        raise TrainingSetupError("Give --dataset_name or --train_file, not both.")
    check_dataset_name(
        args.dataset_name, "a text file or folder, or a Hub dataset id; leave it out for the embedded corpus"
    )
    if not 0 <= args.validation_split_percentage < 100:
        raise TrainingSetupError(
            f"--validation_split_percentage must be in [0, 100), got {args.validation_split_percentage}."
        )
    name = args.dataset_name or (None if args.train_file else EMBEDDED_CORPUS)
    hub_ids: list[str] = []
    documents = True
    validation = None
    if name == EMBEDDED_CORPUS:
        train = datasets.Dataset.from_dict({args.text_column: embedded_corpus()})
        description = "Python's `pydoc_data.topics` documentation text (PSF license)"
        if args.streaming:
            train = train.to_iterable_dataset()
    elif name is not None and not _looks_local(name):
        loaded = load_hub_dataset(
            name, args, "data pass a path (a file or folder that exists)", streaming=args.streaming
        )
        train = loaded[args.train_split]
        check_text_column(train, args.text_column, f"Dataset {name!r}")
        train = train.select_columns([args.text_column])
        if args.validation_split in loaded and not args.validation_file:
            validation = loaded[args.validation_split].select_columns([args.text_column])
        hub_ids.append(name)
        description = f"[{name}](https://huggingface.co/datasets/{name})"
        documents = False
    else:
        paths = [name] if name else list(args.train_file)
        train = _load_local(paths, args.text_column, args.streaming, "training")
        description = "local files " + ", ".join(Path(p).name for p in paths)
        documents = not all(Path(p).suffix.lower() in (".txt", ".text", ".md") or Path(p).is_dir() for p in paths)
    if args.validation_file:
        validation = _load_local(list(args.validation_file), args.text_column, False, "validation")
    if validation is None:
        train, validation = _split_validation(train, args)
    label = hub_ids[0] if hub_ids else Path(name or args.train_file[0]).name  # the embedded corpus: its own name
    return TextSource(train, validation, description, hub_ids, documents, label)


def _split_validation(train, args: TextDataArguments):
    import datasets

    if isinstance(train, datasets.IterableDataset):
        held_out = list(train.take(args.streaming_validation_examples))
        validation = datasets.Dataset.from_list(held_out) if held_out else None
        return train.skip(args.streaming_validation_examples), validation
    if args.validation_split_percentage == 0:
        return train, None
    count = len(train)
    held = max(1, int(round(count * args.validation_split_percentage / 100)))
    if count < 2:
        raise TrainingSetupError(f"The training data has {count} example(s): too few to hold out a validation split.")
    # The last examples, not a random sample: neighbouring lines of a text would otherwise leak into training.
    return train.select(range(count - held)), train.select(range(count - held, count))


def tokenize_and_pack(
    dataset, tokenizer, block_size: int, text_column: str, add_eos: bool, num_proc: int | None = None, desc: str = ""
):
    """Tokenize `dataset[text_column]` and pack the tokens into blocks of `block_size` (`input_ids`, `labels`).

    Lines of text files are concatenated as they are (line breaks are kept in the text); whole documents are
    separated by the tokenizer's EOS token when `add_eos`. Tokens left over at the end of each batch of 1,000
    examples are dropped.
    """
    import datasets

    eos = [tokenizer.eos_token_id] if add_eos and tokenizer.eos_token_id is not None else []

    def tokenize_and_pack_batch(batch):
        ids = tokenizer(batch[text_column], add_special_tokens=False, verbose=False)["input_ids"]
        flat = [token for row in ids for token in row + eos]
        usable = len(flat) // block_size * block_size
        blocks = [flat[i : i + block_size] for i in range(0, usable, block_size)]
        return {"input_ids": blocks, "labels": [list(b) for b in blocks]}

    progress = {}
    if isinstance(dataset, datasets.Dataset):
        progress = {"num_proc": num_proc, "desc": f"Tokenizing {desc} into blocks of {block_size}".strip()}
    return dataset.map(
        tokenize_and_pack_batch, batched=True, batch_size=1000, remove_columns=column_names(dataset), **progress
    )
