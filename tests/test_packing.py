"""Packing is a function of the documents alone: the same books give the same training blocks from a dataset
repository folder, a Hub id, a list of parquet, text or JSON Lines files, a folder of files, streamed or not, and
with one or two tokenizing processes. Every equality is pinned on the blocks `aot train lm` trains on (the
Trainer's dataset), against the blocks packed by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("datasets")
pytest.importorskip("tokenizers")

from transformers import TrainingArguments

from aot_transformers.training.arguments import TrainingSetupError
from aot_transformers.training.lm import LMModelArguments, prepare_lm_training, train_bpe_tokenizer
from aot_transformers.training.text_data import (
    TextDataArguments,
    embedded_corpus,
    hold_out_the_end,
    load_text_source,
)

BLOCK_SIZE = 32
HUB_ID = "someone/books"
# A document read line by line tokenizes differently: a blank line is one token of its own ("\n\n"), trailing spaces
# before a line break join it. The books below have both.
TRAP = "A line with trailing spaces   \nthe next one\n\n\n    an indented line ✓\nthe end, no final line break"
BOOKS = [*embedded_corpus()[:11], TRAP]
VALIDATION_BOOKS = embedded_corpus()[11:13]


def _parquet(path: Path, texts: list[str]) -> str:
    import datasets

    path.parent.mkdir(parents=True, exist_ok=True)
    datasets.Dataset.from_dict({"text": texts}).to_parquet(str(path))
    return str(path)


def _text(path: Path, text: str) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def books(tmp_path_factory) -> dict:
    """The same books, and the same validation books, laid out every way `aot train lm` reads them, and the tokenizer
    to pack them with."""
    root = tmp_path_factory.mktemp("books")
    half = len(BOOKS) // 2
    repo = root / "repository"  # Hub layout: a card declaring the splits, two training shards
    _parquet(repo / "data" / "train-00000-of-00002.parquet", BOOKS[:half])
    _parquet(repo / "data" / "train-00001-of-00002.parquet", BOOKS[half:])
    _parquet(repo / "data" / "validation-00000-of-00001.parquet", VALIDATION_BOOKS)
    (repo / "README.md").write_text(
        "---\nconfigs:\n- config_name: default\n  data_files:\n  - split: train\n    path: data/train-*.parquet\n"
        "  - split: validation\n    path: data/validation-*.parquet\n---\n# Books\n"
    )
    texts = [_text(root / "text" / "train" / f"book{i:02d}.txt", book) for i, book in enumerate(BOOKS)]
    parquets = [_parquet(root / "parquet" / f"book{i:02d}.parquet", [book]) for i, book in enumerate(BOOKS)]
    with open(root / "books.jsonl", "w", encoding="utf-8") as handle:
        handle.writelines(json.dumps({"text": book, "title": f"book {i}"}) + "\n" for i, book in enumerate(BOOKS))
    validation_texts = [_text(root / "text" / "validation" / f"v{i}.txt", b) for i, b in enumerate(VALIDATION_BOOKS)]
    _parquet(root / "shards" / "part-0.parquet", BOOKS[:half])  # no card, no split names: a bag of training files
    _parquet(root / "shards" / "part-1.parquet", BOOKS[half:])
    tokenizer = train_bpe_tokenizer(BOOKS, vocab_size=300, show_progress=False)
    tokenizer.save_pretrained(root / "tokenizer")
    stream = [t for book in BOOKS for t in [*tokenizer(book, add_special_tokens=False)["input_ids"], 0]]
    blocks = torch.tensor(stream[: len(stream) // BLOCK_SIZE * BLOCK_SIZE]).view(-1, BLOCK_SIZE)
    validation = {"validation_file": validation_texts}
    return {
        "root": root,
        "tokenizer": str(root / "tokenizer"),
        "blocks": blocks,  # packed by hand: each book whole, then <|endoftext|> (id 0)
        "sources": {
            "repository folder": {"dataset_name": str(repo)},
            "Hub id": {"dataset_name": HUB_ID},
            "parquet files": {"train_file": parquets, **validation},
            "text files": {"train_file": texts, **validation},
            "text folder": {"train_file": [str(root / "text" / "train")], **validation},
            "text and parquet files": {
                "train_file": [texts[i] if i % 2 else parquets[i] for i in range(len(BOOKS))],
                **validation,
            },
            "JSON Lines file": {"train_file": [str(root / "books.jsonl")], **validation},
            "folder of shards": {"dataset_name": str(root / "shards"), **validation},
        },
    }


@pytest.fixture
def hub(books, monkeypatch):
    """`datasets.load_dataset(HUB_ID)` reads the repository folder, as a download of that repository would give it;
    the cache of this test's datasets and blocks is its own."""
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(books["root"].parent / "cache"))
    load_dataset = datasets.load_dataset

    def from_the_stand_in_hub(path, *args, **kwargs):
        return load_dataset(str(books["root"] / "repository") if path == HUB_ID else path, *args, **kwargs)

    monkeypatch.setattr(datasets, "load_dataset", from_the_stand_in_hub)


def _training_blocks(tmp_path: Path, tokenizer: str, data: dict, workers: int | None = None, **streaming) -> tuple:
    """The blocks `aot train lm` would train on, as one tensor, and the run's text source."""
    arguments = TrainingArguments(
        output_dir=str(tmp_path / "run"), max_steps=1, report_to="none", use_cpu=True, save_strategy="no"
    )
    model = LMModelArguments(
        preset="aot-mssa-l-tiny",
        config_overrides="hidden_size=32,num_hidden_layers=1,num_attention_heads=4,vocab_size=320",
        tokenizer_name_or_path=tokenizer,
    )
    data_args = TextDataArguments(**data, block_size=BLOCK_SIZE, preprocessing_num_workers=workers, **streaming)
    run = prepare_lm_training(model, data_args, arguments)
    train = run.trainer.train_dataset
    rows = train["input_ids"] if not data_args.streaming else [row["input_ids"] for row in train]
    labels = train["labels"] if not data_args.streaming else [row["labels"] for row in train]
    assert rows == labels
    if data_args.streaming:
        assert train.n_shards == 1  # one stream: data-loader workers cannot pack their shares apart
    return torch.tensor(rows), run.source


SOURCES = [
    "repository folder",
    "Hub id",
    "parquet files",
    "text files",
    "text folder",
    "text and parquet files",
    "JSON Lines file",
    "folder of shards",
]


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("workers", [1, 2])
def test_the_same_books_give_the_same_blocks_from_every_source_and_number_of_workers(
    tmp_path, books, hub, source, workers
):
    blocks, text_source = _training_blocks(tmp_path, books["tokenizer"], books["sources"][source], workers)
    assert torch.equal(blocks, books["blocks"])
    assert list(text_source.validation["text"]) == VALIDATION_BOOKS
    assert text_source.hub_ids == ([HUB_ID] if source == "Hub id" else [])  # the Hub's branch, not the folder's


@pytest.mark.parametrize("source", SOURCES)
def test_streamed_books_give_the_blocks_of_the_books_read_whole(tmp_path, books, hub, source):
    blocks, _ = _training_blocks(tmp_path, books["tokenizer"], books["sources"][source], streaming=True)
    assert torch.equal(blocks, books["blocks"])


def test_a_text_file_is_one_document_ended_by_eos(tmp_path, books, hub):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(books["tokenizer"])
    source = load_text_source(TextDataArguments(train_file=[str(books["root"] / "text" / "train" / "book11.txt")]))
    assert "".join([*source.train["text"], *source.validation["text"]]) == TRAP  # read whole, line breaks and all
    assert source.documents
    run_blocks, _ = _training_blocks(
        tmp_path, books["tokenizer"], {"train_file": books["sources"]["text files"]["train_file"][:2]}
    )
    first_book = tokenizer(BOOKS[0], add_special_tokens=False)["input_ids"]
    assert run_blocks.flatten()[len(first_book)] == tokenizer.eos_token_id  # between the two files


def test_one_book_or_many_lose_the_end_of_their_text_to_validation():
    import datasets

    one = datasets.Dataset.from_dict({"text": ["\n".join(f"line {i} of the only book" for i in range(200))]})
    train, validation = hold_out_the_end(one, 10.0)
    assert train["text"][0] + validation["text"][0] == one["text"][0]
    assert validation["text"][0].startswith("line ") and train["text"][0].endswith("\n")  # cut at a line start
    assert abs(len(validation["text"][0]) / len(one["text"][0]) - 0.10) < 0.01
    many = datasets.Dataset.from_dict({"text": BOOKS})
    train, validation = hold_out_the_end(many, 5.0)
    total = sum(map(len, BOOKS))
    assert abs(sum(map(len, validation["text"])) / total - 0.05) < 0.01
    cut = len(train) - 1  # the book cut in two ends one split and starts the other
    assert list(train["text"])[:cut] == BOOKS[:cut] and list(validation["text"])[1:] == BOOKS[cut + 1 :]
    assert train["text"][cut] + validation["text"][0] == BOOKS[cut]
    with pytest.raises(TrainingSetupError, match="too short to hold out 5.0%"):
        hold_out_the_end(datasets.Dataset.from_dict({"text": ["x"]}), 5.0)


def test_a_stream_smaller_than_its_hold_out_is_split_and_packed_as_the_file_is(tmp_path, books, hub):
    data = {"train_file": [str(books["root"] / "books.jsonl")], "validation_split_percentage": 5.0}
    whole, whole_source = _training_blocks(tmp_path / "whole", books["tokenizer"], data)
    streamed, streamed_source = _training_blocks(tmp_path / "streamed", books["tokenizer"], data, streaming=True)
    assert torch.equal(streamed, whole)
    assert list(streamed_source.validation["text"]) == list(whole_source.validation["text"])


def test_the_blocks_cache_is_keyed_by_the_text_alone(tmp_path, books, hub):
    """A copy of the corpus made anew (new paths and times, as every session gets the shared data), the same rows in
    other files, a selection of them or another string type: one key; another text, tokenizer or block size: another.
    """
    import shutil

    import datasets
    import pyarrow as pa
    from transformers import AutoTokenizer

    from aot_transformers.training.text_data import _blocks_cache_file

    tokenizer = AutoTokenizer.from_pretrained(books["tokenizer"])
    copy = shutil.copytree(books["root"] / "repository", tmp_path / "copy")

    def key(dataset, tokenizer=tokenizer, block_size=BLOCK_SIZE):
        return _blocks_cache_file(dataset, tokenizer, block_size, "text", [0])

    repository = datasets.load_dataset(str(books["root"] / "repository"), split="train")
    one_file = datasets.load_dataset("parquet", data_files=_parquet(tmp_path / "one.parquet", BOOKS), split="train")
    longer = datasets.load_dataset("parquet", data_files=_parquet(tmp_path / "more.parquet", [*BOOKS, "x"]))["train"]
    large = one_file.cast(datasets.Features({"text": datasets.Value("large_string")}))
    assert pa.types.is_large_string(large.data.column("text").type)
    same = [datasets.load_dataset(str(copy), split="train"), one_file, longer.select(range(len(BOOKS))), large]
    assert {key(dataset) for dataset in same} == {key(repository)}
    other_tokenizer = train_bpe_tokenizer(BOOKS, vocab_size=280, show_progress=False)
    others = [key(longer), key(repository.select(range(1, len(BOOKS)))), key(repository, other_tokenizer)]
    assert len({*others, key(repository, block_size=16), key(repository)}) == 5


_PACK_AND_REPORT = """
import sys, time, datasets, transformers
from aot_transformers.training.text_data import tokenize_and_pack
datasets.config.HF_DATASETS_CACHE = sys.argv[1]
tokenizer = transformers.AutoTokenizer.from_pretrained(sys.argv[3])
calls = []
original = type(tokenizer).__call__
# Slow, so that the two processes' preparations overlap.
type(tokenizer).__call__ = lambda self, *a, **k: calls.append(time.sleep(2)) or original(self, *a, **k)
train = datasets.load_dataset(sys.argv[2], split="train")
blocks = tokenize_and_pack(train, tokenizer, 32, "text", add_eos=True)
print(len(calls), sum(map(sum, blocks["input_ids"])))
"""


def test_a_second_process_packing_the_same_text_waits_for_the_first_and_reads_its_blocks(tmp_path, books):
    import subprocess
    import sys

    arguments = [str(tmp_path / "cache"), str(books["root"] / "repository"), books["tokenizer"]]
    processes = [
        subprocess.Popen([sys.executable, "-c", _PACK_AND_REPORT, *arguments], stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    reports = [process.communicate(timeout=300)[0].split() for process in processes]
    assert all(process.returncode == 0 for process in processes)
    assert sorted(int(calls) > 0 for calls, _ in reports) == [False, True]  # one tokenized, the other read its blocks
    assert reports[0][1] == reports[1][1] == str(int(books["blocks"].sum()))
