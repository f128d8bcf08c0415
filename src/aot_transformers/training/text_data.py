"""Text data for causal-LM training: Hub datasets, local files and folders, streaming, the embedded corpus, and
packing of token blocks."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._io import arg, is_hub_id
from .arguments import TrainingSetupError, check_dataset_name, load_hub_dataset

if TYPE_CHECKING:
    import pyarrow as pa
    from datasets import Dataset, IterableDataset
    from transformers import PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

# File suffix -> `datasets` builder.
TEXT_BUILDERS = {
    **dict.fromkeys((".txt", ".text", ".md"), "text"),
    **dict.fromkeys((".json", ".jsonl"), "json"),
    ".parquet": "parquet",
    ".csv": "csv",
}
EMBEDDED_CORPUS = "pydoc-topics"
STRING_DTYPES = ("string", "large_string", "string_view")  # `datasets.Value` dtypes of text
TOKENIZE_BATCH = 8  # documents tokenized at once: books are large, a few at a time keeps each process's memory flat


@dataclass
class TextDataArguments:
    """Where the training text comes from and how it becomes blocks of tokens."""

    dataset_name: str | None = arg(
        None,
        "A Hub dataset id, a local file or folder (txt/json/jsonl/parquet/csv), or "
        f"'{EMBEDDED_CORPUS}' (Python's own documentation text, no download). Default: {EMBEDDED_CORPUS}.",
    )
    dataset_config_name: str | None = arg(None, "Config name of a Hub dataset.")
    train_file: list[str] | None = arg(
        None,
        "Local training files or folders (instead of --dataset_name), read in the order given (a folder's files in "
        "sorted order). A .txt/.md file is one document; each row of a json/jsonl/parquet/csv file is one.",
    )
    validation_file: list[str] | None = arg(
        None, "Local validation files or folders (default: split off the training data)."
    )
    train_split: str = arg("train", "Split of a dataset repository (Hub id or folder) to train on.")
    validation_split: str = arg("validation", "Split of a dataset repository to validate on, when it has one.")
    test_split: str = arg("test", "Split of a dataset repository evaluated once after training, when it has one.")
    text_column: str = arg("text", "Column holding the text.")
    validation_split_percentage: float = arg(
        5.0,
        "Share of the training text held out for validation, when there is no validation data: its end, from the "
        "start of a line (a stream larger than --streaming_validation_examples holds out its first examples).",
    )
    block_size: int | None = arg(None, "Tokens per training block (default: min(512, max_position_embeddings)).")
    streaming: bool = arg(False, "Stream the data (files larger than memory); needs --max_steps.")
    streaming_validation_examples: int = arg(
        200, "With --streaming and no validation data: hold out this many examples."
    )
    max_train_samples: int | None = arg(None, "Use at most this many training blocks.")
    max_eval_samples: int | None = arg(None, "Use at most this many validation blocks.")
    preprocessing_num_workers: int | None = arg(None, "Processes for tokenization.")


@dataclass(frozen=True)
class RowOrigin:
    """Where the rows of a split were read from, so that a bad row can be named by its file and its row there.

    The rows are those of `files` (`(datasets builder, file)` pairs, read in this order), or of the split `split` of
    the dataset repository `repository` (a folder or Hub id, config `config`), whose files are only looked up when a
    row must be named; the split begins `skipped` rows in (a stream's hold-out, a held-out end).
    """

    files: tuple[tuple[str, str], ...] = ()
    repository: str | None = None
    config: str | None = None
    split: str = "train"
    skipped: int = 0

    def after(self, rows: int) -> RowOrigin:
        """The origin of the same rows without their first `rows`."""
        return replace(self, skipped=self.skipped + rows)

    def locate(self, row: int) -> tuple[str, int] | None:
        """`(file, row within it, from 0)` of row `row` of the split, or None when that cannot be told. Only the
        files before the row's are counted, a parquet file by its footer: meant for the one row an error names."""
        row += self.skipped
        try:
            for file, count in self._row_counts():
                if row < count:
                    return file, row
                row -= count
        except Exception:  # naming the file is a courtesy: the error names the row all the same
            logger.debug("Could not tell the file of row %d", row, exc_info=True)
        return None

    def _row_counts(self) -> Iterator[tuple[str, int]]:
        import datasets

        if self.repository is None:
            for builder, file in self.files:
                yield file, _rows_of(file, builder)
            return
        builder = datasets.load_dataset_builder(self.repository, self.config)
        for file in builder.config.data_files[self.split]:
            if builder.name == "parquet":
                yield file, _rows_of(file, "parquet")
            else:  # read as the repository's card says (its builder and options), one file alone
                rows = datasets.load_dataset(
                    self.repository, self.config, data_files={self.split: [file]}, split=self.split, streaming=True
                )
                yield file, sum(1 for _ in rows)


def _rows_of(file: str, builder: str) -> int:
    """The rows `datasets` reads from `file` with `builder`: a parquet file's from its footer, a text file's one
    (a document, `sample_by="document"`), others by reading the file."""
    import datasets

    if builder == "parquet":
        import fsspec
        import pyarrow.parquet as pq

        with fsspec.open(file, "rb") as handle:  # a local path or a Hub URL (hf://...): the footer alone is read
            return pq.ParquetFile(handle).metadata.num_rows
    if builder == "text":
        return 1
    return sum(1 for _ in datasets.load_dataset(builder, data_files=[file], split="train", streaming=True))


@dataclass
class TextSource:
    """Loaded raw text splits and how to describe them in the model card."""

    train: Any
    validation: Any
    description: str
    hub_ids: list[str]
    documents: bool  # examples are whole documents, separated by EOS when packed: always, whatever the source
    name: str = "custom"  # the dataset's name in the model card's model-index
    test: Any = None  # a repository's test split: never trained or validated on, evaluated once at the end
    origins: dict[str, RowOrigin] = field(default_factory=dict)  # "train", "validation", "test": where rows come from


def _looks_local(name: str) -> bool:
    """A path, an existing file or folder, or not a Hub id; a Hub id ending in a data-file suffix counts as a file."""
    return not is_hub_id(name) or Path(name).suffix.lower() in TEXT_BUILDERS or name.endswith(".gz")


def is_dataset_repository(name: str) -> bool:
    """A local folder laid out as a Hub dataset repository: a dataset card whose YAML declares `configs`, or data
    files whose names mark splits other than train (`data/validation-*.parquet`, `test.jsonl`, ...). Such a folder is
    read as `datasets.load_dataset(folder)` reads it, splits and all; any other folder is a bag of training files."""
    from datasets.data_files import get_data_patterns
    from huggingface_hub.repocard import metadata_load

    folder = Path(name).expanduser()
    if not folder.is_dir():
        return False
    card = folder / "README.md"
    if card.is_file() and "configs" in (metadata_load(card) or {}):
        return True
    try:
        return bool(set(get_data_patterns(str(folder))) - {"train"})
    except Exception:  # datasets' EmptyDatasetError and friends: no data files, so no repository
        return False


def collect_files(paths: list[str], what: str = "training") -> list[tuple[str, str]]:
    """Local files as `(datasets builder, file)` pairs, in the order given; a folder gives its files (searched
    recursively) in sorted order. Raises `TrainingSetupError` for a missing path, an unsupported suffix, or a folder
    with no usable file."""
    ordered: list[tuple[str, str]] = []
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
        ordered += [(TEXT_BUILDERS[file.suffix.lower()], str(file)) for file in found]
    return ordered


def check_text_file(path: str | os.PathLike, text_column: str = "text", what: str = "training") -> None:
    """Read a local text, JSON Lines or CSV file once and refuse what `datasets` would choke on, naming the file and
    the line: an empty file, bytes that are not UTF-8 (latin-1, UTF-16, binary data), a JSON line that is not a JSON
    object, or a record whose `text_column` is missing, null or not a string. Of a parquet file only the footer is
    read: a damaged or truncated file, one without `text_column`, one whose `text_column` does not hold strings, or
    one with no rows is refused (a null in a row is found when the row is tokenized, by `RowOrigin`). Raises
    `TrainingSetupError` for the first problem found (exit code 2, before anything is tokenized).
    """
    path = Path(path)
    builder = TEXT_BUILDERS.get(path.suffix.lower())

    def refuse(problem: str) -> TrainingSetupError:
        return TrainingSetupError(f"{what} data: {path} {problem}")

    if path.stat().st_size == 0:
        raise refuse("is empty.")
    if builder == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            metadata = pq.ParquetFile(path).metadata  # the footer alone: a truncated file has none
        except Exception as error:
            raise refuse(f"is not a readable parquet file ({error}): damaged or truncated.") from None
        schema = metadata.schema.to_arrow_schema()
        if text_column not in schema.names:
            raise refuse(
                f"has no text column {text_column!r} (columns: {schema.names[:10]}); choose it with --text_column."
            )
        if metadata.num_rows == 0:
            raise refuse("holds no rows.")
        kind = schema.field(text_column).type
        kind = kind.value_type if pa.types.is_dictionary(kind) else kind  # categorical text is text
        if pa.types.is_null(kind):
            raise refuse(f"holds no text: its text column {text_column!r} is null in every row.")
        if not (pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind)):
            raise refuse(
                f"has a text column {text_column!r} of {kind} values, not strings; choose the column of text with "
                "--text_column."
            )
        return
    if builder not in ("text", "json", "csv"):
        return
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


def _load_local(paths: list[str], text_column: str, streaming: bool, what: str) -> tuple[Any, RowOrigin]:
    """The documents of local files, in their order, and where they come from: a text file is one document (read
    whole, as a parquet row holds a book), a row of any other file is one. Consecutive files of one kind are read by
    one `datasets` builder."""
    import itertools

    import datasets

    ordered = collect_files(paths, what)
    parts = []
    for builder, run in itertools.groupby(ordered, key=lambda pair: pair[0]):
        files = [file for _, file in run]
        for file in files:
            check_text_file(file, text_column, what)
        # Line by line, each line would be tokenized alone: a text split at its line breaks tokenizes differently
        # (GPT-2 has one token for "\n\n") and could not give the blocks the same book gives as a parquet row.
        kwargs = {"sample_by": "document"} if builder == "text" else {}
        part = datasets.load_dataset(builder, data_files=files, split="train", streaming=streaming, **kwargs)
        check_text_column(part, text_column, f"{what} files {files[:3]}{'…' if len(files) > 3 else ''}")
        parts.append(part.select_columns([text_column]))
    return parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts), RowOrigin(tuple(ordered))


def embedded_corpus() -> list[str]:
    """Python's `pydoc_data.topics` (about 465 KB of English documentation, in every CPython), one topic each."""
    from pydoc_data.topics import topics

    return [topics[key] for key in sorted(topics)]


def column_names(dataset: Dataset | IterableDataset) -> list[str]:
    """Columns of a `Dataset` or `IterableDataset` (peeking at the first example when the features are unknown)."""
    names = getattr(dataset, "column_names", None)
    return list(names if names is not None else next(iter(dataset), {}))


def check_text_column(dataset: Dataset | IterableDataset, text_column: str, where: str) -> None:
    """Raise `TrainingSetupError` when `dataset` has no `text_column`, or one whose values (when its features are
    known) are not strings: a column of numbers (as a CSV's is read), or of nulls only."""
    import datasets

    names = column_names(dataset)
    if text_column not in names:
        raise TrainingSetupError(
            f"{where} has no text column {text_column!r} (columns: {names}); choose one with --text_column."
        )
    feature = (getattr(dataset, "features", None) or {}).get(text_column)
    if feature is None or isinstance(feature, datasets.Value) and feature.dtype in STRING_DTYPES:
        return
    kind = feature.dtype if isinstance(feature, datasets.Value) else type(feature).__name__
    raise TrainingSetupError(
        f"{where}: the text column {text_column!r} holds {kind} values, not strings; choose the column of text with "
        "--text_column."
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
    validation = test = None
    origins: dict[str, RowOrigin] = {}
    if name == EMBEDDED_CORPUS:
        train = datasets.Dataset.from_dict({args.text_column: embedded_corpus()})
        description = "Python's `pydoc_data.topics` documentation text (PSF license)"
        if args.streaming:
            train = train.to_iterable_dataset()
    elif name is not None and (is_dataset_repository(name) or not _looks_local(name)):
        local, config = Path(name).is_dir(), None
        # A folder is read from its files as resolved here: `datasets` (5.2) caches them by their mtimes, but the
        # folder by its name and card alone (an edited shard was read from the cache). What fails here fails again,
        # and is reported, in `load_hub_dataset`.
        with contextlib.suppress(Exception):
            config = datasets.load_dataset_builder(name, args.dataset_config_name).config if local else None
        files = getattr(config, "data_files", None)
        by_line = getattr(config, "field", None) is None  # JSON as `check_text_file` reads it, not one document
        for shard in (file for split in (files or {}).values() for file in split if by_line):  # `datasets` would
            check_text_file(shard, args.text_column, "training")  # name neither the file nor the row of a bad text
        loaded = load_hub_dataset(
            name, args, "data pass a path (a file or folder that exists)", streaming=args.streaming, data_files=files
        )
        check_text_column(loaded[args.train_split], args.text_column, f"Dataset {name!r}")
        train, validation, test = (
            loaded[split].select_columns([args.text_column]) if split in loaded else None
            for split in (args.train_split, args.validation_split, args.test_split)
        )
        splits = {"train": args.train_split, "validation": args.validation_split, "test": args.test_split}
        origins = {
            key: RowOrigin(repository=name, config=args.dataset_config_name, split=split)
            for key, split in splits.items()
        }
        if args.streaming:  # only the training split is streamed; the held-out ones are read once, as a whole
            validation, test = (
                datasets.Dataset.from_list(list(split)) if split is not None else None for split in (validation, test)
            )
        if local:
            description = f"the dataset repository {Path(name).name} (its {', '.join(loaded)} splits)"
        else:
            hub_ids.append(name)
            description = f"[{name}](https://huggingface.co/datasets/{name})"
    else:
        paths = [name] if name else list(args.train_file)
        train, origins["train"] = _load_local(paths, args.text_column, args.streaming, "training")
        description = "local files " + ", ".join(Path(p).name for p in paths)
    if args.validation_file:
        validation, origins["validation"] = _load_local(
            list(args.validation_file), args.text_column, False, "validation"
        )
    if validation is None:
        whole = origins.get("train", RowOrigin())
        train, validation, (train_start, validation_start) = _split_validation(train, args)
        origins["train"], origins["validation"] = whole.after(train_start), whole.after(validation_start)
    label = hub_ids[0] if hub_ids else Path(name or args.train_file[0]).name  # the embedded corpus: its own name
    return TextSource(train, validation, description, hub_ids, True, label, test, origins)


def _split_validation(
    train: Dataset | IterableDataset, args: TextDataArguments
) -> tuple[Dataset | IterableDataset, Dataset | None, tuple[int, int]]:
    """`(train, validation, (train start, validation start))` of a source without validation data: a file's (or a
    small stream's) text loses its end (`hold_out_the_end`); a larger stream, which has no end to hold out, its first
    `streaming_validation_examples` examples. The starts are the rows of the source where each split begins."""
    import datasets

    share = args.validation_split_percentage
    if isinstance(train, datasets.IterableDataset):
        held = args.streaming_validation_examples
        head = list(train.take(held + 1)) if held else []  # one more than the hold-out: is anything left to train on?
        if held and len(head) <= held:  # the whole stream: held out as the same text in a file would be
            logger.warning(
                "The stream holds %d examples, not more than --streaming_validation_examples (%d): holding out the "
                "last %s%% of its text (--validation_split_percentage), as for a file.",
                len(head), held, share or 5.0,
            )  # fmt: skip
            train, validation = hold_out_the_end(datasets.Dataset.from_list(head), share or 5.0, args.text_column)
            return train.to_iterable_dataset(), validation, (0, len(head) - len(validation))
        validation = datasets.Dataset.from_list(head[:held]) if held else None
        return train.skip(held), validation, (held, 0)
    if share == 0:
        return train, None, (0, 0)
    rows = len(train)
    train, validation = hold_out_the_end(train, share, args.text_column)
    return train, validation, (0, rows - len(validation))  # validation begins inside the last training document


def hold_out_the_end(documents: Dataset, share: float, text_column: str = "text") -> tuple[Dataset, Dataset]:
    """Split a `Dataset` of documents into `(train, validation)`: validation is the last `share` percent of the
    text, from the start of the line where it begins (from that very character when the training side would
    otherwise be empty). One book or many lose the same share; the document cut in two ends the training split and
    begins the validation split, so no line falls on both sides. Raises `TrainingSetupError` when the text is too
    short to leave something on both sides."""
    import datasets
    import numpy as np
    import pyarrow.compute as pc

    if documents.column_names != [text_column]:
        documents = documents.select_columns([text_column])
    features = documents.features
    lengths = [
        pc.utf8_length(batch[text_column]).fill_null(0).to_numpy(zero_copy_only=False)
        for batch in documents.with_format("arrow").iter(batch_size=1000)
    ]
    ends = np.cumsum(np.concatenate(lengths)) if lengths else np.zeros(1, dtype=np.int64)
    target = int(ends[-1]) - max(1, round(int(ends[-1]) * share / 100))  # the first held-out character
    if target <= 0:
        raise TrainingSetupError(
            f"The training text ({int(ends[-1])} characters) is too short to hold out {share}% of it for validation; "
            "give --validation_file or more text."
        )
    index = int(np.searchsorted(ends, target, side="right"))  # the document holding that character
    text = documents[index][text_column]
    offset = target - (int(ends[index - 1]) if index else 0)
    cut = text.rfind("\n", 0, offset) + 1 or (0 if index else offset)  # the start of its line

    # (documents, piece) or (piece, documents), leaving out what is empty
    def join(first: range | str, second: range | str) -> Dataset:
        parts = [
            documents.select(part)
            if isinstance(part, range)
            else datasets.Dataset.from_dict({text_column: [part]}, features)
            for part in (first, second)
            if len(part)
        ]
        return datasets.concatenate_datasets(parts) if len(parts) > 1 else parts[0]

    return join(range(index), text[:cut]), join(text[cut:], range(index + 1, len(documents)))


def tokenize_and_pack(
    dataset: Dataset | IterableDataset,
    tokenizer: PreTrainedTokenizerBase,
    block_size: int,
    text_column: str,
    add_eos: bool,
    num_proc: int | None = None,
    desc: str = "",
    origin: RowOrigin | None = None,
) -> Dataset | IterableDataset:
    """Tokenize `dataset[text_column]` and pack the tokens into blocks of `block_size` (`input_ids`, `labels`).

    Lines of text files are concatenated as they are (line breaks are kept in the text); whole documents are
    separated by the tokenizer's EOS token when `add_eos`. A `Dataset` is tokenized in parallel (`num_proc`
    processes), a few documents per batch so that memory stays flat, and packed as one stream: the blocks are a
    function of the documents alone, whatever the number of processes, and only the last partial block is dropped.
    The blocks of file-backed data are cached on disk, keyed by the data, the tokenizer and the block size, so a
    second run on the same data memory-maps them at once. A stream (`IterableDataset`) is tokenized and packed on the
    fly into the same blocks, one stream of one shard (splitting it between data-loader workers would pack each
    worker's documents apart).

    A row whose text is not a string (a null) is refused with a `TrainingSetupError` naming the column and the row,
    and, with `origin` (where the rows of `dataset` were read from), the file and the row within it.
    """
    import datasets
    import pyarrow as pa

    eos = [tokenizer.eos_token_id] if add_eos and tokenizer.eos_token_id is not None else []

    def tokenize(batch: Mapping[str, list[Any]], indices: Sequence[int]) -> dict[str, list[list[int]]]:
        texts = batch[text_column]
        for index, text in zip(indices, texts, strict=True):
            if not isinstance(text, str):
                found = origin.locate(index) if origin is not None else None
                where = f"{found[0]}, row {found[1]} (counting from 0)" if found else f"row {index}"
                raise TrainingSetupError(
                    f"{desc or 'the data'}: {where} of the text column {text_column!r} holds "
                    f"{type(text).__name__} {text!r:.40}, not a string."
                )
        ids = tokenizer(texts, add_special_tokens=False, verbose=False)["input_ids"]
        return {"input_ids": [row + eos for row in ids]}

    if not isinstance(dataset, datasets.Dataset):
        window = datasets.List(datasets.Value("int32"), length=block_size)
        return datasets.IterableDataset.from_generator(
            _stream_blocks,
            datasets.Features({"input_ids": window, "labels": window}),
            gen_kwargs={
                "dataset": dataset,
                "tokenize": tokenize,
                "text_column": text_column,
                "block_size": block_size,
            },
        )
    cached = _blocks_cache_file(dataset, tokenizer, block_size, text_column, eos)
    if cached is None:
        return datasets.Dataset(datasets.table.InMemoryTable(pa.Table.from_batches(
            _pack(_tokens(dataset, tokenize, num_proc, desc).data.column("input_ids"), block_size),
            blocks_schema(block_size),
        )))  # fmt: skip
    from filelock import FileLock

    with FileLock(f"{cached}.lock"):  # a second run on the same text waits for the first and reads its blocks
        if not cached.is_file():
            with tempfile.TemporaryDirectory(dir=cached.parent) as scratch:
                tokens = _tokens(dataset, tokenize, num_proc, desc, str(Path(scratch) / "tokens.arrow"))
                staging = Path(scratch) / "blocks.arrow"
                with pa.OSFile(str(staging), "wb") as sink, pa.ipc.new_stream(sink, blocks_schema(block_size)) as out:
                    for batch in _pack(tokens.data.column("input_ids"), block_size):
                        out.write_batch(batch)
                del tokens
                os.replace(staging, cached)  # atomic: a reader sees the whole file or none
    return datasets.Dataset.from_file(str(cached))


def _tokens(
    dataset: Dataset,
    tokenize: Callable[..., dict[str, list[list[int]]]],
    num_proc: int | None,
    desc: str,
    cache_file_name: str | None = None,
) -> Dataset:
    """`dataset` tokenized in parallel, a few documents per batch (one `input_ids` list per row)."""
    import datasets

    return dataset.map(
        tokenize,
        with_indices=True,
        batched=True,
        batch_size=TOKENIZE_BATCH,
        writer_batch_size=TOKENIZE_BATCH,
        num_proc=num_proc,
        remove_columns=dataset.column_names,
        features=datasets.Features({"input_ids": datasets.List(datasets.Value("int32"))}),
        desc=f"Tokenizing {desc}".strip(),
        **({"cache_file_name": cache_file_name} if cache_file_name else {}),
    )


def _stream_blocks(
    dataset: IterableDataset, tokenize: Callable[..., dict[str, list[list[int]]]], text_column: str, block_size: int
) -> Iterator[dict[str, list[int]]]:
    """The blocks of a stream of documents, as `_pack` makes them of a `Dataset`: the tokens of one batch that do not
    fill a block begin the next one."""
    import numpy as np

    carry, start = np.empty(0, dtype=np.int32), 0
    for batch in dataset.iter(batch_size=TOKENIZE_BATCH):
        count = len(batch[text_column])
        rows = tokenize(batch, range(start, start + count))["input_ids"]
        start += count
        values = np.concatenate([carry, *(np.asarray(row, dtype=np.int32) for row in rows)])
        usable = len(values) // block_size * block_size
        carry = values[usable:]
        for block in values[:usable].reshape(-1, block_size).tolist():
            yield {"input_ids": block, "labels": block}


def blocks_schema(block_size: int) -> pa.Schema:
    """The Arrow schema of packed blocks: `input_ids` and `labels`, `block_size` int32 token ids each."""
    import pyarrow as pa

    window = pa.list_(pa.int32(), block_size)
    return pa.schema([("input_ids", window), ("labels", window)])


def _pack(token_lists: pa.ChunkedArray, block_size: int) -> Iterator[pa.RecordBatch]:
    """Consecutive `block_size` windows of a column of token lists read as one stream, yielded as Arrow record
    batches of `input_ids` and `labels` (one batch per chunk of the column: memory stays at one chunk, no Python
    list of the corpus is ever built). The last partial window is dropped."""
    import numpy as np
    import pyarrow as pa

    carry = np.empty(0, dtype=np.int32)
    for chunk in token_lists.chunks:
        values = np.concatenate([carry, chunk.flatten().to_numpy()])  # `flatten` honours the chunk's slice offsets
        usable = len(values) // block_size * block_size
        carry = values[usable:]
        if usable:
            windows = pa.FixedSizeListArray.from_arrays(pa.array(values[:usable]), block_size)
            yield pa.RecordBatch.from_arrays([windows, windows], schema=blocks_schema(block_size))


def _blocks_cache_file(
    dataset: Dataset, tokenizer: PreTrainedTokenizerBase, block_size: int, text_column: str, eos: list[int]
) -> Path | None:
    """Where the packed blocks of a file-backed `dataset` live in the `datasets` cache (an Arrow file), keyed by its
    text (`_text_digest`: a copy of the corpus made anew, with new paths and times, hits the same file), the tokenizer,
    the block size and the separator; None when they are not cached (data held in memory, or a tokenizer without a
    `tokenizers` backend)."""
    import datasets

    backend = getattr(tokenizer, "backend_tokenizer", None)
    if not dataset.cache_files or backend is None:
        return None
    key = [_text_digest(dataset, text_column), backend.to_str(), block_size, eos]
    root = Path(datasets.config.HF_DATASETS_CACHE) / "aot_blocks"
    root.mkdir(parents=True, exist_ok=True)
    return root / f"{hashlib.sha256(json.dumps(key).encode()).hexdigest()[:24]}.arrow"


def _text_digest(dataset: Dataset, text_column: str) -> str:
    """SHA-256 of a text column in row order, as two streams: each value's UTF-8 length (-1 for a null), then the
    characters. Equal rows give one digest whatever files, slices, selections or Arrow chunks hold them."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    lengths, characters = hashlib.sha256(), hashlib.sha256()
    for batch in dataset.select_columns([text_column]).with_format("arrow").iter(batch_size=4096):
        column = batch.column(0)
        for chunk in getattr(column, "chunks", [column]):
            chunk = chunk.cast(pa.large_string())
            lengths.update(pc.binary_length(chunk).fill_null(-1).to_numpy().astype(np.int64).tobytes())
            offsets, data = chunk.buffers()[1:3]
            if data is not None and len(chunk):
                bounds = np.frombuffer(offsets, dtype=np.int64)[[chunk.offset, chunk.offset + len(chunk)]]
                characters.update(memoryview(data)[bounds[0] : bounds[1]])
    return lengths.hexdigest() + characters.hexdigest()
