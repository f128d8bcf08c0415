"""Clear errors: bad training input is one line naming the argument or the file (and line), exit code 2, before any
training step — never a traceback, never a silent default or a silently wrong dataset.

Bad data (text, images, archives, pixel CSVs), zero or negative work, misspelt overrides, bad TrainingArguments
values, bad fine-tuning folders, and inputs that used to train without a word. The output folder is in
tests/test_data_loss.py, the evaluation and verify commands in tests/test_trust.py.
"""

from __future__ import annotations

import gzip
import io
import json
import tarfile
from pathlib import Path

import pytest

pytest.importorskip("datasets")

from aot_transformers import AoTConfig, AoTForCausalLM, export_model
from aot_transformers.cli import main


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("text") / "corpus.txt"
    path.write_text("\n".join(f"line {i} of a small corpus for the tokenizer" for i in range(300)) + "\n")
    return path


def lm(data: Path | str, output: Path, *extra: str) -> list[str]:
    return [
        "train",
        "lm",
        "--dataset_name",
        str(data),
        "--output_dir",
        str(output),
        "--tokenizer_vocab_size",
        "300",
        "--block_size",
        "16",
        "--use_cpu",
        "--report_to",
        "none",
        "--max_steps",
        "1",
        *extra,
    ]


def image(data: Path | str, output: Path, *extra: str) -> list[str]:
    return ["train", "image", "--dataset_name", str(data), "--output_dir", str(output), "--use_cpu", "--report_to",
            "none", "--max_steps", "1", *extra]  # fmt: skip


def refused(argv: list[str], capsys, *needles: str) -> str:
    """Run `aot …`; it must exit 2 with exactly one error line holding every needle, and leave no trace: an output
    folder that was not there is not there afterwards."""
    output = Path(argv[argv.index("--output_dir") + 1]) if "--output_dir" in argv else None
    new = output is not None and not output.exists()
    code = main(argv)
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if ": error: " in line]
    assert code == 2, err
    assert len(errors) == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in errors[0], errors[0]
    if output is not None:
        assert not list(output.glob("checkpoint-*"))
        assert not (new and output.exists()), sorted(p.name for p in output.iterdir())
    return errors[0]


# Bad training data.


@pytest.mark.parametrize(
    "name, content, needles",
    [
        ("empty.txt", b"", ["is empty"]),
        ("binary.txt", b"text\n\x00\x01\x02\xff\n", ["line 2", "binary"]),
        ("latin1.txt", "caf\u00e9 au lait\n".encode("latin-1"), ["line 1", "not UTF-8"]),
        ("utf16.txt", "hello\n".encode("utf-16"), ["UTF-16"]),
        ("truncated.jsonl", b'{"text": "one"}\n{"text": "tw', ["line 2", "not valid JSON"]),
        ("notjson.jsonl", b"just words\n", ["line 1", "not valid JSON"]),
        ("null.jsonl", b'{"text": "ok"}\n{"text": null}\n', ["line 2", "NoneType"]),
        ("number.jsonl", b'{"text": 3}\n', ["line 1", "int 3"]),
        ("array.jsonl", b"[1, 2]\n", ["line 1", "not an object"]),
        ("missing.jsonl", b'{"body": "x"}\n', ["line 1", "no text column 'text'"]),
    ],
)
def test_bad_text_file_is_refused_naming_the_file_and_line(tmp_path, capsys, name, content, needles):
    path = tmp_path / name
    path.write_bytes(content)
    refused(lm(path, tmp_path / "out"), capsys, name, *needles)


def _shard(path: Path, texts: list[str], column: str = "text") -> Path:
    import datasets

    path.parent.mkdir(parents=True, exist_ok=True)
    datasets.Dataset.from_dict({column: texts}).to_parquet(str(path))
    return path


def _damage(shard: Path, how: str) -> None:
    good = shard.read_bytes()
    if how == "truncated":
        shard.write_bytes(good[: len(good) // 2])
    elif how == "empty":
        shard.write_bytes(b"")
    elif how == "random bytes":
        shard.write_bytes(bytes(range(256)) * 8)
    elif how == "another column":
        _shard(shard, ["a book"] * 4, column="content")
    elif how == "no rows":
        _shard(shard, [])


DAMAGE = {
    "truncated": "not a readable parquet file",
    "empty": "is empty",
    "random bytes": "not a readable parquet file",
    "another column": "no text column 'text'",
    "no rows": "holds no rows",
}


@pytest.mark.parametrize("how", sorted(DAMAGE))
def test_a_damaged_shard_of_a_dataset_repository_is_refused_naming_the_file(tmp_path, capsys, how):
    repo = tmp_path / "repo"
    books = [f"book {i}: " + "words of a book " * 20 for i in range(8)]
    for split, texts in (("train", books[:6]), ("validation", books[6:])):
        _shard(repo / "data" / f"{split}-00000-of-00001.parquet", texts)
    files = "".join(f"  - split: {split}\n    path: data/{split}-*.parquet\n" for split in ("train", "validation"))
    (repo / "README.md").write_text(f"---\nconfigs:\n- config_name: default\n  data_files:\n{files}---\n")
    _damage(repo / "data" / "validation-00000-of-00001.parquet", how)
    refused(lm(repo, tmp_path / "out"), capsys, "validation-00000-of-00001.parquet", DAMAGE[how])
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("how", sorted(DAMAGE))
def test_a_damaged_parquet_file_is_refused_naming_it(tmp_path, capsys, how):
    shard = _shard(tmp_path / "books.parquet", [f"book {i}: " + "words " * 40 for i in range(8)])
    _damage(shard, how)
    refused(lm(shard, tmp_path / "out"), capsys, "books.parquet", DAMAGE[how])
    assert not (tmp_path / "out").exists()


# A null or a non-string text: named by its file and its row there, wherever the rows are read from.

BOOK = "words of a book " * 20
HUB_ID = "someone/books"


def _card(repo: Path, suffix: str) -> None:
    files = "".join(f"  - split: {split}\n    path: data/{split}-*.{suffix}\n" for split in ("train", "validation"))
    (repo / "README.md").write_text(f"---\nconfigs:\n- config_name: default\n  data_files:\n{files}---\n")


def _null_in_the_second_shard(root: Path, layout: str) -> Path:
    """Training text whose fourth document, the second row of its second file, is null: `layout` says how it is laid
    out (a repository folder of parquet or JSON Lines shards, parquet files, a CSV file)."""
    shards = [[BOOK, BOOK], [BOOK, None, BOOK]]
    if layout == "csv":
        path = root / "books.csv"
        path.write_text("title,text\n" + "".join(f"b{i},{text or ''}\n" for i, text in enumerate(shards[1])))
        return path
    if layout == "parquet files":
        for i, texts in enumerate(shards):
            _shard(root / "files" / f"part-{i}.parquet", texts)
        return root / "files"
    repo = root / "repo"
    if layout == "jsonl repository":
        (repo / "data").mkdir(parents=True)
        for i, texts in enumerate([*shards, [BOOK, BOOK]]):
            name = f"train-{i:05d}-of-00002.jsonl" if i < 2 else "validation-00000-of-00001.jsonl"
            (repo / "data" / name).write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
        _card(repo, "jsonl")
        return repo
    for i, texts in enumerate(shards):
        _shard(repo / "data" / f"train-{i:05d}-of-00002.parquet", texts)
    _shard(repo / "data" / "validation-00000-of-00001.parquet", [BOOK, BOOK])
    _card(repo, "parquet")
    return repo


@pytest.fixture
def own_datasets_cache(tmp_path, monkeypatch):
    """This test's own `datasets` cache, so that nothing of another test's folders (or the user's cache) is read."""
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "cache"))


@pytest.mark.parametrize(
    "layout, extra, where",
    [
        ("parquet repository", [], "train-00001-of-00002.parquet, row 1 (counting from 0)"),
        ("parquet repository", ["--streaming"], "train-00001-of-00002.parquet, row 1 (counting from 0)"),
        ("jsonl repository", [], "train-00001-of-00002.jsonl line 2"),  # read line by line before loading
        ("Hub id", [], "train-00001-of-00002.parquet, row 1 (counting from 0)"),
        ("Hub id", ["--streaming"], "train-00001-of-00002.parquet, row 1 (counting from 0)"),
        ("parquet files", [], "part-1.parquet, row 1 (counting from 0)"),
        ("parquet files", ["--streaming", "--streaming_validation_examples", "1"], "part-1.parquet, row 1 (counting"),
        ("csv", [], "books.csv, row 1 (counting from 0)"),
    ],
)
def test_a_null_text_is_refused_naming_its_file_and_row(
    tmp_path, capsys, monkeypatch, own_datasets_cache, layout, extra, where
):
    import datasets

    data = _null_in_the_second_shard(tmp_path, "parquet repository" if layout == "Hub id" else layout)
    if layout == "Hub id":  # the Hub serves the repository folder, as a download of it would give it

        def from_the_folder(load, folder=str(data)):
            return lambda path, *args, **kwargs: load(folder if path == HUB_ID else path, *args, **kwargs)

        for name in ("load_dataset", "load_dataset_builder"):
            monkeypatch.setattr(datasets, name, from_the_folder(getattr(datasets, name)))
        data = HUB_ID
    refused(lm(data, tmp_path / "out", *extra), capsys, where, "text column 'text' holds NoneType None")


# Rows of JSON Lines shards whose texts are strings in some rows and not in others: `datasets` cast a number or an
# object after strings to a string and trained on it, and failed on a string after a number (or on a list after a
# string) with a DatasetGenerationError that named neither the file nor the row.
MIXED = {
    "a number before strings": ([[3, BOOK], [BOOK]], "train-00000-of-00002.jsonl line 1", "holds int 3"),
    "a number after strings": ([[BOOK, BOOK], [BOOK, 3]], "train-00001-of-00002.jsonl line 2", "holds int 3"),
    "a list after strings": ([[BOOK], [BOOK, ["a", "b"]]], "train-00001-of-00002.jsonl line 2", "holds list ['a'"),
    "an object after strings": ([[BOOK], [{"a": 1}]], "train-00001-of-00002.jsonl line 1", "holds dict {'a': 1}"),
}


@pytest.mark.parametrize("flag", ["--dataset_name", "--train_file"])
@pytest.mark.parametrize("mix", sorted(MIXED))
def test_a_text_that_is_not_a_string_amid_strings_in_json_lines_is_refused_naming_its_file_and_line(
    tmp_path, capsys, own_datasets_cache, mix, flag
):
    shards, where, holds = MIXED[mix]
    repo = tmp_path / "repo"
    (repo / "data").mkdir(parents=True)
    for i, texts in enumerate([*shards, [BOOK, BOOK]]):
        name = f"train-{i:05d}-of-00002.jsonl" if i < 2 else "validation-00000-of-00001.jsonl"
        (repo / "data" / name).write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    _card(repo, "jsonl")
    argv = lm(repo if flag == "--dataset_name" else repo / "data", tmp_path / "out")
    argv[argv.index("--dataset_name")] = flag
    refused(argv, capsys, where, f"the text column 'text' {holds}")


@pytest.mark.parametrize(
    "values, needle",
    [([1, 2, 3], "a text column 'text' of int64 values, not strings"), ([None, None], "is null in every row")],
)
def test_a_shard_whose_text_column_holds_no_strings_is_refused_naming_it(tmp_path, capsys, values, needle):
    import pyarrow as pa
    import pyarrow.parquet as pq

    repo = _null_in_the_second_shard(tmp_path, "parquet repository")
    pq.write_table(pa.table({"text": values}), repo / "data" / "train-00001-of-00002.parquet")  # footer: int64, null
    refused(lm(repo, tmp_path / "out"), capsys, "train-00001-of-00002.parquet", needle)


def test_a_csv_file_whose_text_column_holds_numbers_is_refused_naming_it(tmp_path, capsys, own_datasets_cache):
    path = tmp_path / "numbers.csv"
    path.write_text("title,text\na,12\nb,34\n")  # read as a column of integers
    refused(lm(path, tmp_path / "out"), capsys, "numbers.csv", "the text column 'text' holds int64 values")


def test_corrupt_image_is_refused_naming_the_file(tmp_path, capsys):
    from PIL import Image

    for label in ("cat", "dog"):
        folder = tmp_path / "images" / label
        folder.mkdir(parents=True)
        for i in range(3):
            Image.new("RGB", (8, 8), (i * 40, 0, 0)).save(folder / f"{i}.png")
    (tmp_path / "images" / "dog" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n not really")
    refused(image(tmp_path / "images", tmp_path / "out"), capsys, "broken.png", "not a readable image")


def test_truncated_cifar_archive_is_refused_naming_the_archive(tmp_path, capsys):
    from PIL import Image

    folder = tmp_path / "cifar"
    folder.mkdir()
    for label in ("cat", "dog"):
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
            for i in range(20):
                encoded = io.BytesIO()
                Image.new("RGB", (32, 32), (i, i, i)).save(encoded, format="PNG")
                info = tarfile.TarInfo(f"train/{label}/{i:04d}.png")
                info.size = len(encoded.getvalue())
                tar.addfile(info, io.BytesIO(encoded.getvalue()))
        data = buffer.getvalue()
        (folder / f"train_{label}.tar.gz").write_bytes(data if label == "cat" else data[: len(data) // 2])
    refused(image(folder, tmp_path / "out"), capsys, "train_dog.tar.gz", "truncated")


@pytest.mark.parametrize(
    "rows, needles",
    [
        (["1,2,3,4,0", "nan,2,3,4,1"], ["line 2", "finite numbers in [0, 255]"]),  # NaN used to become 0
        (["1,2,3,4,0", "1,2,3,4,1.5"], ["line 2", "'1.5' is not an integer"]),  # 1.5 used to become 1
        (["1,2,3,4,0", "1,2,3,300,1"], ["line 2", "[0, 255]"]),
        (["1,2,3,4,0", "1,2,3,1"], ["line 2", "4 columns"]),
        (["1,2,3,4,0", "1,2,x,4,1"], ["line 2", "'x' is not a number"]),
        (["pixel0,pixel1,pixel2,pixel3,label"], ["no data rows"]),
    ],
)
def test_bad_pixel_csv_row_is_refused_naming_the_line(tmp_path, capsys, rows, needles):
    path = tmp_path / "pixels.csv"
    path.write_text("\n".join(rows) + "\n")
    refused(image(path, tmp_path / "out"), capsys, "pixels.csv", *needles)


def test_truncated_gzipped_pixel_csv_is_refused(tmp_path, capsys):
    path = tmp_path / "pixels.csv.gz"
    data = gzip.compress(("\n".join("1,2,3,4,0" for _ in range(2000)) + "\n").encode())
    path.write_bytes(data[: len(data) // 2])
    refused(image(path, tmp_path / "out"), capsys, "pixels.csv.gz", "cannot be read")


# Zero or negative amounts of work, silent defaults, misspelt overrides.


@pytest.mark.parametrize(
    "extra, needles",
    [
        (["--num_train_epochs", "-1", "--max_steps", "-1"], ["--num_train_epochs -1.0"]),
        (["--num_train_epochs", "0", "--max_steps", "-1"], ["--num_train_epochs 0.0"]),
        (["--max_steps", "0"], ["--max_steps 0"]),
        (["--max_steps", "-5"], ["--max_steps -5"]),
        (["--block_size", "0"], ["--block_size 0", "at least 1"]),
        (["--tokenizer_vocab_size", "0"], ["--tokenizer_vocab_size 0"]),
        (["--max_train_samples", "-3"], ["--max_train_samples -3"]),
        (["--config_overrides", "hiden_size=64"], ["--config_overrides 'hiden_size'", "did you mean 'hidden_size'"]),
        (["--config_overrides", "knn_k=0"], ["field 'knn_k'", "got 0"]),  # the typed config's own check, one line
        (["--model_type", "gpt2", "--config_overrides", "n_layer=abc"], ["field 'n_layer'", "expected int"]),
    ],
)
def test_zero_or_negative_work_and_misspelt_overrides_are_refused(corpus, tmp_path, capsys, extra, needles):
    argv = lm(corpus, tmp_path / "out")
    for flag in ("--max_steps", "--block_size", "--tokenizer_vocab_size"):  # the last value given wins: drop ours
        if flag in extra and flag in argv:
            position = argv.index(flag)
            del argv[position : position + 2]
    refused(argv + extra, capsys, *needles)


@pytest.mark.parametrize("flag, value", [("--lm-epochs", "-1"), ("--image-epochs", "0"), ("--lm-epochs", "nan"),
                                         ("--seed", "-1")])  # fmt: skip
def test_demo_refuses_no_work_before_writing(tmp_path, capsys, flag, value):
    with pytest.raises(SystemExit) as exited:
        main(["demo", "--output-dir", str(tmp_path / "demo"), flag, value])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and flag in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "demo").exists()


# Bad TrainingArguments values and fine-tuning folders.


@pytest.mark.parametrize(
    "extra, needle",
    [
        (["--per_device_train_batch_size", "0"], "--per_device_train_batch_size 0"),
        (["--gradient_accumulation_steps", "0"], "--gradient_accumulation_steps 0"),
        (["--learning_rate", "nan"], "--learning_rate nan"),
        (["--learning_rate", "inf"], "--learning_rate inf"),
        (["--learning_rate", "-0.1"], "--learning_rate -0.1"),
        (["--seed", "-1"], "--seed -1"),
        (["--weight_decay", "nan"], "--weight_decay nan"),
        (["--adam_beta2", "1.5"], "--adam_beta2 1.5"),
        (["--save_steps", "0"], "--save_steps 0"),
    ],
)
def test_out_of_range_training_arguments_are_refused(corpus, tmp_path, capsys, extra, needle):
    refused(lm(corpus, tmp_path / "out") + extra, capsys, needle)


@pytest.fixture
def saved(tmp_path) -> Path:
    config = AoTConfig.from_preset("aot-mssa-l-tiny", hidden_size=32, num_hidden_layers=1, vocab_size=300)
    return export_model(AoTForCausalLM(config), tmp_path / "base")


def test_fine_tuning_from_a_pickle_only_folder_is_refused(saved, corpus, tmp_path, capsys):
    import torch

    state = AoTForCausalLM.from_pretrained(saved).state_dict()
    (saved / "model.safetensors").unlink()
    torch.save(state, saved / "pytorch_model.bin")
    refused(lm(corpus, tmp_path / "out", "--model_name_or_path", str(saved)), capsys, "--model_name_or_path", "pickle")


def test_fine_tuning_from_truncated_weights_is_refused(saved, corpus, tmp_path, capsys):
    weights = saved / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    refused(lm(corpus, tmp_path / "out", "--model_name_or_path", str(saved)), capsys, "model.safetensors", "truncated")


def test_a_lora_adapter_folder_is_refused_by_every_command_that_takes_a_model_naming_its_base(
    saved, corpus, tmp_path, capsys
):
    peft = pytest.importorskip("peft")
    adapter = tmp_path / "adapter"
    model = peft.get_peft_model(AoTForCausalLM.from_pretrained(saved), peft.LoraConfig(r=2, task_type="CAUSAL_LM"))
    model.save_pretrained(adapter)
    needles = ("LoRA adapter of", str(saved), "PeftModel.from_pretrained", "--merge_lora")
    refused(lm(corpus, tmp_path / "out", "--model_name_or_path", str(adapter)), capsys, *needles)
    evaluate = [
        "eval",
        "lm",
        str(adapter),
        "--tasks",
        "ptb",
        "--data",
        f"ptb={corpus}",
        "--output-dir",
        str(tmp_path / "eval"),
    ]
    refused(evaluate, capsys, *needles)
    refused(["export", "onnx", str(adapter), str(tmp_path / "a.onnx")], capsys, *needles)
    weights = adapter / "adapter_model.safetensors"  # a damaged adapter is named as an adapter too, not a broken model
    weights.write_bytes(weights.read_bytes()[:100])
    assert "lack" not in refused(lm(corpus, tmp_path / "out", "--model_name_or_path", str(adapter)), capsys, *needles)
    assert not any((tmp_path / name).exists() for name in ("out", "eval", "a.onnx"))


def test_fine_tuning_from_weights_that_are_already_nan_is_refused_naming_them(saved, corpus, tmp_path, capsys):
    from safetensors.torch import load_file, save_file

    weights = load_file(saved / "model.safetensors")
    weights["model.norm.weight"][0] = float("nan")
    save_file(weights, saved / "model.safetensors", metadata={"format": "pt"})
    argv = lm(corpus, tmp_path / "out", "--model_name_or_path", str(saved))
    line = refused(argv, capsys, "model.norm.weight", "already hold NaN or inf")
    assert "learning_rate" not in line  # not "diverged, lower --learning_rate": the weights came that way
    assert not (tmp_path / "out").exists()


def test_evaluating_or_exporting_weights_whose_shapes_contradict_the_config_names_them(
    saved, corpus, tmp_path, capsys
):
    from support import char_tokenizer

    char_tokenizer().save_pretrained(saved)
    config = json.loads((saved / "config.json").read_text())
    config["hidden_size"] = 64  # the weights say 32
    (saved / "config.json").write_text(json.dumps(config))
    needles = (
        "do not have the shapes its config.json gives",
        "model.embed_tokens.weight [300, 32] vs config [300, 64]",
    )
    evaluate = [
        "eval",
        "lm",
        str(saved),
        "--tasks",
        "ptb",
        "--data",
        f"ptb={corpus}",
        "--output-dir",
        str(tmp_path / "e"),
    ]
    assert "ignore_mismatched_sizes" not in refused(evaluate, capsys, *needles)
    export = ["export", "onnx", str(saved), str(tmp_path / "m.onnx")]
    assert "ignore_mismatched_sizes" not in refused(export, capsys, *needles)
    assert not (tmp_path / "m.onnx").exists()


@pytest.mark.parametrize("version", [1, 3])  # 3 ended on CPU in "no available devices found, must be one of 'XPU'…"
def test_an_fsdp_version_other_than_2_is_refused_naming_the_supported_one(corpus, tmp_path, capsys, version):
    config = json.dumps({"version": version, "transformer_layer_cls_to_wrap": ["AoTLayer"]})
    argv = lm(corpus, tmp_path / "out", "--fsdp", "full_shard", "--fsdp_config", config)
    line = refused(argv, capsys, f"--fsdp_config version {version}", "FSDP2 is the supported version")
    assert "no available devices" not in line


def test_fine_tuning_from_weights_whose_shapes_contradict_the_config_is_refused(saved, corpus, tmp_path, capsys):
    config = json.loads((saved / "config.json").read_text())
    config["hidden_size"] = 64  # the weights say 32
    (saved / "config.json").write_text(json.dumps(config))
    argv = lm(corpus, tmp_path / "out", "--model_name_or_path", str(saved))
    needles = ("model.safetensors: model.embed_positions.weight has shape [256, 32]", "config.json gives [256, 64]")
    assert "ignore_mismatched_sizes" not in refused(argv, capsys, *needles)


# Inputs that used to train (or evaluate) without a word, and raw errors for argument files.


def _without(folder: Path, prefix: str) -> Path:
    """`folder` with the tensors named `prefix…` removed from its weights (as a hand-edited or partial save)."""
    from safetensors.torch import load_file, save_file

    weights = folder / "model.safetensors"
    tensors = {name: t for name, t in load_file(weights).items() if not name.startswith(prefix)}
    save_file(tensors, weights, metadata={"format": "pt"})
    return folder


@pytest.mark.parametrize("content", ["   \n\n\t\n  \n" * 50, '{"text": "   "}\n{"text": "\\n"}\n'])
def test_text_that_is_only_whitespace_is_refused(tmp_path, capsys, content):
    path = tmp_path / ("blank.jsonl" if content.startswith("{") else "blank.txt")
    path.write_text(content)
    refused(lm(path, tmp_path / "out"), capsys, str(path), "only whitespace")


@pytest.mark.parametrize("command", [lm, image])
def test_an_empty_dataset_name_is_refused_not_replaced_by_the_default_data(tmp_path, capsys, command):
    refused(command("", tmp_path / "out"), capsys, "--dataset_name ''", "is empty")


def test_fine_tuning_from_weights_without_the_position_table_is_refused(saved, corpus, tmp_path, capsys):
    _without(saved, "model.embed_positions.")
    refused(
        lm(corpus, tmp_path / "out", "--model_name_or_path", str(saved)),
        capsys,
        "--model_name_or_path",
        "model.embed_positions.weight",
        "initialised at random",
    )


def test_negative_crop_padding_is_refused(tmp_path, capsys):
    refused(image("sklearn-digits", tmp_path / "out", "--crop_padding", "-2"), capsys, "--crop_padding -2", ">= 0")


def test_fsdp_config_without_fsdp_is_refused(corpus, tmp_path, capsys):
    config = '{"version": 2, "transformer_layer_cls_to_wrap": ["AoTLayer"]}'
    refused(lm(corpus, tmp_path / "out", "--fsdp_config", config), capsys, "--fsdp_config", "without --fsdp")


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ("{bad", "is not valid JSON"),
        ("[1, 2]", "no such file"),
        ("missing.json", "no such file"),
        ("list.json", "is not a JSON object"),
        ("broken.json", "is not valid JSON"),
    ],
)
def test_a_malformed_fsdp_config_is_refused_naming_the_flag(corpus, tmp_path, capsys, value, needle):
    (tmp_path / "list.json").write_text("[1, 2]")
    (tmp_path / "broken.json").write_text("{bad")
    value = str(tmp_path / value) if value.endswith(".json") else value
    refused(
        lm(corpus, tmp_path / "out", "--fsdp", "full_shard", "--fsdp_config", value), capsys, "--fsdp_config", needle
    )


@pytest.mark.parametrize(
    "override", ["vocab_size=1000000000000", "mlp_ratio=1e9,mlp_layers=all", "max_position_embeddings=10000000000000"]
)
def test_a_model_larger_than_the_machine_is_refused_before_any_data_is_read(corpus, tmp_path, capsys, override):
    # Without the check, a vocabulary of 10**12 aborted the process inside the tokenizer trainer (a Rust panic).
    argv = lm(corpus, tmp_path / "out", "--config_overrides", override)
    refused(argv, capsys, "parameters", "GiB of float32 weights alone", "of memory", override.split("=")[0])


def test_a_lora_rank_larger_than_the_adapted_layers_is_refused(saved, corpus, tmp_path, capsys):
    pytest.importorskip("peft")
    argv = lm(corpus, tmp_path / "out", "--model_name_or_path", str(saved), "--lora_r", "100000")
    refused(argv, capsys, "--lora_r 100000", "larger than the adapted layers", "[1, 32]")


def test_lora_over_a_randomly_initialised_base_is_refused(corpus, tmp_path, capsys):
    pytest.importorskip("peft")
    refused(lm(corpus, tmp_path / "out", "--lora_r", "4"), capsys, "--lora_r 4", "--model_name_or_path")


@pytest.mark.parametrize(
    "name, content, needles",
    [
        ("missing.json", None, ["arguments file", "missing.json", "no such arguments file"]),
        ("missing.yaml", None, ["arguments file", "missing.yaml", "no such arguments file"]),
        ("bad.yaml", "output_dir: [unclosed\nmax_steps: 1\n", ["bad.yaml", "line", "not valid YAML"]),
        ("bad.json", '{"output_dir": "x",\n "max_steps": }', ["bad.json", "line 2", "not valid JSON"]),
        ("list.yaml", "- output_dir\n- x\n", ["list.yaml", "mapping"]),
        ("empty.yml", "", ["empty.yml", "mapping"]),
    ],
)
@pytest.mark.parametrize("overrides", [[], ["--max_steps", "1"]])
def test_a_missing_or_malformed_arguments_file_is_one_line_naming_it(
    tmp_path, capsys, name, content, needles, overrides
):
    path = tmp_path / name
    if content is not None:
        path.write_text(content)
    refused(["train", "lm", str(path), *overrides], capsys, *needles)
