"""Causal-LM training: data sources, tokenizer, packing, clear errors before training, checkpoints, resume after
SIGKILL, and the final hub-ready folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

pytest.importorskip("datasets")
pytest.importorskip("tokenizers")

from transformers import AutoModelForCausalLM, AutoTokenizer, TrainingArguments

from aot_transformers.training.arguments import PublishArguments, TrainingSetupError
from aot_transformers.training.lm import (
    LMModelArguments,
    prepare_lm_training,
    run_lm_training,
    train_bpe_tokenizer,
    train_lm,
    unigram_perplexity,
)
from aot_transformers.training.run_state import last_complete_checkpoint, resolve_resume
from aot_transformers.training.text_data import (
    TextDataArguments,
    embedded_corpus,
    load_text_source,
    tokenize_and_pack,
)

TINY = "hidden_size=32,num_hidden_layers=2,num_attention_heads=4,vocab_size=320,max_position_embeddings=64"
REPO_ROOT = Path(__file__).resolve().parents[1]


def corpus_lines(count: int = 400) -> list[str]:
    lines = [line for text in embedded_corpus()[:20] for line in text.splitlines() if line.strip()]
    return lines[:count]


@pytest.fixture(scope="module")
def text_dir(tmp_path_factory) -> Path:
    """The same small corpus as .txt, .jsonl, .json and .parquet, plus a folder of text files."""
    import datasets

    root = tmp_path_factory.mktemp("text")
    lines = corpus_lines()
    (root / "train.txt").write_text("\n".join(lines) + "\n")
    with open(root / "train.jsonl", "w") as handle:
        for line in lines:
            handle.write(json.dumps({"text": line, "id": 1}) + "\n")
    (root / "train.json").write_text(json.dumps([{"text": line} for line in lines]))
    datasets.Dataset.from_dict({"text": lines}).to_parquet(str(root / "train.parquet"))
    with open(root / "notext.jsonl", "w") as handle:
        handle.write(json.dumps({"body": "no text column here"}) + "\n")
    folder = root / "folder"
    folder.mkdir()
    (folder / "a.txt").write_text("\n".join(lines[:200]) + "\n")
    (folder / "sub").mkdir()
    (folder / "sub" / "b.txt").write_text("\n".join(lines[200:]) + "\n")
    return root


def training_args(tmp_path: Path, **overrides) -> TrainingArguments:
    fields = dict(
        output_dir=str(tmp_path / "run"),
        max_steps=4,
        per_device_train_batch_size=4,
        per_device_eval_batch_size=8,
        learning_rate=3e-3,
        report_to="none",
        use_cpu=True,
        save_strategy="no",
        eval_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
        seed=0,
    )
    fields.update(overrides)
    return TrainingArguments(**fields)


def tiny_model_args(**overrides) -> LMModelArguments:
    return LMModelArguments(**{"preset": "aot-mssa-l-tiny", "config_overrides": TINY, **overrides})


# --------------------------------------------------------------------------------------------------------------
# tokenizer and packing
# --------------------------------------------------------------------------------------------------------------


def test_bpe_tokenizer_round_trips_any_text_and_saves(tmp_path):
    tokenizer = train_bpe_tokenizer(corpus_lines(), vocab_size=300, show_progress=False)
    assert len(tokenizer) == 300
    text = "def f(x):\n    return x ** 2  # ünïcödé ✓"
    assert tokenizer.decode(tokenizer(text)["input_ids"]) == text  # byte-level: nothing is unknown
    tokenizer.save_pretrained(tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    assert reloaded(text)["input_ids"] == tokenizer(text)["input_ids"]
    assert reloaded.eos_token == "<|endoftext|>"
    with pytest.raises(ValueError, match="vocab_size"):
        train_bpe_tokenizer(["abc"], vocab_size=100)


def test_packing_makes_full_blocks_with_labels():
    import datasets

    tokenizer = train_bpe_tokenizer(corpus_lines(), vocab_size=300, show_progress=False)
    data = datasets.Dataset.from_dict({"text": corpus_lines(100)})
    packed = tokenize_and_pack(data, tokenizer, block_size=16, text_column="text", add_eos=True)
    assert packed.column_names == ["input_ids", "labels"]
    assert all(len(row) == 16 for row in packed["input_ids"])
    assert packed["input_ids"] == packed["labels"]
    total = sum(len(tokenizer(t, add_special_tokens=False)["input_ids"]) + 1 for t in data["text"])
    assert len(packed) == total // 16


def test_unigram_perplexity_of_uniform_text_is_vocab_size():
    blocks = {"input_ids": [[0, 1, 2, 3] * 50]}
    assert unigram_perplexity(blocks, blocks, vocab_size=4) == pytest.approx(4.0, rel=1e-3)


# --------------------------------------------------------------------------------------------------------------
# data sources
# --------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["train.txt", "train.jsonl", "train.json", "train.parquet", "folder"])
def test_local_sources_load_the_same_text(text_dir, name):
    source = load_text_source(TextDataArguments(dataset_name=str(text_dir / name), validation_split_percentage=10))
    assert source.train.column_names == ["text"]
    texts = [*source.train["text"], *source.validation["text"]]
    lines = corpus_lines()
    if name.endswith(("json", "jsonl", "parquet")):  # a row is a document
        assert texts == lines
    else:  # a text file is one document, read whole with its line breaks
        assert "".join(texts) == "\n".join(lines) + "\n" and len(texts) == (2 if name == "train.txt" else 3)
    held = sum(map(len, source.validation["text"])) / sum(map(len, texts))
    assert 0.09 < held < 0.11  # the last 10% of the text


def test_streaming_source_holds_out_validation(text_dir):
    import datasets

    source = load_text_source(
        TextDataArguments(train_file=[str(text_dir / "train.jsonl")], streaming=True, streaming_validation_examples=7)
    )
    assert isinstance(source.train, datasets.IterableDataset)
    assert len(source.validation) == 7
    first_train = next(iter(source.train))["text"]
    assert first_train == corpus_lines()[7]


def test_a_stream_smaller_than_its_hold_out_holds_out_the_text_a_file_would(text_dir, tmp_path):
    import datasets

    small = tmp_path / "small.jsonl"
    small.write_text("".join(json.dumps({"text": line}) + "\n" for line in corpus_lines()[:40]))
    arguments = TextDataArguments(train_file=[str(small)], streaming=True, validation_split_percentage=10)
    source = load_text_source(arguments)  # the default hold-out (200 examples) would leave nothing to train on
    arguments.streaming = False
    whole = load_text_source(arguments)
    assert isinstance(source.train, datasets.IterableDataset)
    assert [row["text"] for row in source.train] == list(whole.train["text"])  # the same last 10% held out
    held = list(whole.validation["text"])
    assert list(source.validation["text"]) == held == corpus_lines()[40 - len(held) : 40]  # whole lines, the last
    one = tmp_path / "one.jsonl"  # one short line: held out from its character at 95%
    one.write_text(json.dumps({"text": "a single line of forty characters, or so"}) + "\n")
    source = load_text_source(TextDataArguments(train_file=[str(one)], streaming=True))
    assert [row["text"] for row in source.train] == ["a single line of forty characters, or "]
    assert list(source.validation["text"]) == ["so"]


def test_embedded_corpus_is_the_default():
    source = load_text_source(TextDataArguments())
    assert len(source.train) > 50 and source.documents
    assert "pydoc" in source.description


@pytest.mark.parametrize(
    "data_args, message",
    [
        (dict(dataset_name="/no/such/file.txt"), "no such file"),
        (dict(train_file=["missing.jsonl"]), "no such file"),
        (dict(dataset_name="NOTEXT"), "no text column 'text'"),
        (dict(dataset_name="train.txt", text_column="body"), "no text column 'body'"),
        (dict(dataset_name="BADSUFFIX"), "unsupported suffix"),
    ],
)
def test_bad_data_is_a_clear_error(text_dir, data_args, message):
    replacements = {
        "NOTEXT": str(text_dir / "notext.jsonl"),
        "train.txt": str(text_dir / "train.txt"),
        "BADSUFFIX": str(text_dir / "weights.bin"),
    }
    if "dataset_name" in data_args:
        data_args["dataset_name"] = replacements.get(data_args["dataset_name"], data_args["dataset_name"])
    (text_dir / "weights.bin").write_bytes(b"\0")
    with pytest.raises(TrainingSetupError, match=message):
        load_text_source(TextDataArguments(**data_args))


def test_a_dataset_name_that_is_no_hub_id_is_read_as_a_local_path():
    # Deeper than namespace/name, or with a data-file suffix: never looked up on the Hub.
    for name in ("corpora/wiki/part-1", "someone/corpus.jsonl"):
        with pytest.raises(TrainingSetupError, match=f"training data: no such file or folder: {name}"):
            load_text_source(TextDataArguments(dataset_name=name))


def test_unknown_hub_dataset_offline_is_a_clear_error(monkeypatch):
    import datasets
    import huggingface_hub

    # Offline mode, as HF_HUB_OFFLINE=1 sets it at import time: the lookup fails at once instead of timing out.
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(TrainingSetupError, match="Could not load dataset 'nobody/nothing-here' from the Hub"):
        load_text_source(TextDataArguments(dataset_name="nobody/nothing-here"))


# --------------------------------------------------------------------------------------------------------------
# errors before training
# --------------------------------------------------------------------------------------------------------------


def _fails_before_training(tmp_path, model_args, data_args, match, **args_overrides):
    with pytest.raises(TrainingSetupError, match=match):
        prepare_lm_training(model_args, data_args, training_args(tmp_path, **args_overrides))
    assert not (tmp_path / "run" / "model").exists()


def test_unknown_preset_is_a_clear_error(tmp_path, text_dir):
    _fails_before_training(
        tmp_path,
        LMModelArguments(preset="aot-nonsense"),
        TextDataArguments(dataset_name=str(text_dir / "train.txt")),
        "Unknown preset 'aot-nonsense'",
    )


def test_bad_override_is_a_clear_error(tmp_path, text_dir):
    _fails_before_training(
        tmp_path, tiny_model_args(config_overrides="hidden_size=30"), TextDataArguments(), "hidden_size"
    )


def test_tokenizer_larger_than_model_vocab_is_a_clear_error(tmp_path, text_dir):
    big = train_bpe_tokenizer(corpus_lines(), vocab_size=400, show_progress=False)
    big.save_pretrained(tmp_path / "big-tokenizer")
    _fails_before_training(
        tmp_path,
        tiny_model_args(tokenizer_name_or_path=str(tmp_path / "big-tokenizer")),
        TextDataArguments(dataset_name=str(text_dir / "train.txt")),
        r"tokenizer has 400 tokens but the model's vocab_size is 320",
    )
    _fails_before_training(
        tmp_path, tiny_model_args(tokenizer_vocab_size=1000), TextDataArguments(), "larger than the model's vocab_size"
    )


def test_block_size_and_streaming_are_checked(tmp_path):
    _fails_before_training(tmp_path, tiny_model_args(), TextDataArguments(block_size=65), "block_size")
    _fails_before_training(tmp_path, tiny_model_args(), TextDataArguments(streaming=True), "--max_steps", max_steps=-1)


def test_missing_checkpoint_and_config_file_are_clear_errors(tmp_path):
    _fails_before_training(
        tmp_path, LMModelArguments(model_name_or_path="./nowhere"), TextDataArguments(), "no such folder"
    )
    _fails_before_training(tmp_path, LMModelArguments(config_file="nowhere.json"), TextDataArguments(), "no such file")
    _fails_before_training(
        tmp_path, tiny_model_args(), TextDataArguments(), "no checkpoint", resume_from_checkpoint="latest"
    )


# --------------------------------------------------------------------------------------------------------------
# training end to end
# --------------------------------------------------------------------------------------------------------------


def test_train_writes_a_hub_ready_folder_and_learns(tmp_path, text_dir):
    metrics = train_lm(
        tiny_model_args(tokenizer_vocab_size=300),
        TextDataArguments(dataset_name=str(text_dir / "train.txt"), block_size=32, validation_split_percentage=10),
        training_args(tmp_path, max_steps=30, eval_strategy="steps", eval_steps=15),
        PublishArguments(model_name="tiny-test"),
    )
    final = tmp_path / "run" / "model"
    names = {p.name for p in final.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "README.md", "results.json"} <= names
    assert {"configuration_aot.py", "attention_aot.py", "modeling_aot.py", "training_curves.png"} <= names
    # 30 steps: close to unigram (1.46x when the validation text was the last 10% of the lines, 1.50x for the last
    # 10% of the characters from a line start)
    assert metrics["eval_perplexity"] < metrics["eval_unigram_perplexity"] * 1.6
    card = (final / "README.md").read_text()
    assert "custom_code" in card and "model-index" in card and "perplexity" in card
    assert not [p for p in final.parent.iterdir() if p.name.startswith(".model")]  # no staging left behind
    model = AutoModelForCausalLM.from_pretrained(final, trust_remote_code=True)
    tokenizer = AutoTokenizer.from_pretrained(final)
    assert len(tokenizer) <= model.config.vocab_size
    out = model.generate(**tokenizer("The ", return_tensors="pt"), max_new_tokens=5, do_sample=False)
    assert out.shape[1] > 1


def test_checkpoints_are_loadable_models_and_fine_tuning_works(tmp_path, text_dir):
    data = TextDataArguments(dataset_name=str(text_dir / "train.txt"), block_size=32)
    train_lm(
        tiny_model_args(tokenizer_vocab_size=300),
        data,
        training_args(tmp_path, max_steps=4, save_steps=2, save_strategy="steps"),
    )
    checkpoint = Path(last_complete_checkpoint(tmp_path / "run"))
    assert checkpoint.name == "checkpoint-4"
    assert {"configuration_aot.py", "modeling_aot.py", "attention_aot.py"} <= {p.name for p in checkpoint.iterdir()}
    model = AutoModelForCausalLM.from_pretrained(checkpoint, trust_remote_code=True)
    assert model.config.auto_map["AutoModelForCausalLM"].startswith("modeling_aot")
    # Fine-tuning from the checkpoint reuses its tokenizer.
    metrics = train_lm(
        LMModelArguments(model_name_or_path=str(checkpoint)),
        data,
        training_args(tmp_path, output_dir=str(tmp_path / "finetune"), max_steps=2),
    )
    card = (tmp_path / "finetune" / "model" / "README.md").read_text()
    # A local base is named in the text, never as `base_model` metadata (the Hub accepts only repository ids there).
    assert "base_model" not in card.split("---")[1]
    assert f"fine-tuned from a local checkpoint (`{checkpoint.name}`)" in card
    assert metrics["final_model_dir"].endswith("model")


def test_incomplete_checkpoint_is_skipped_on_resume(tmp_path):
    run = tmp_path / "run"
    for step, complete in ((2, True), (4, False)):
        folder = run / f"checkpoint-{step}"
        folder.mkdir(parents=True)
        (folder / "model.safetensors").write_bytes(b"")
        if complete:  # the run record, then Trainer's state: both mark a checkpoint complete
            (folder / "aot_run.json").write_text("{}")
            (folder / "trainer_state.json").write_text("{}")
    assert resolve_resume("latest", str(run)).endswith("checkpoint-2")
    with pytest.raises(TrainingSetupError, match="incomplete"):
        resolve_resume(str(run / "checkpoint-4"), str(run))
    assert resolve_resume("auto", str(tmp_path / "empty")) is None


KILLER = textwrap.dedent(
    """
    import os, signal, sys
    from transformers import TrainerCallback
    from aot_transformers.training.lm import main

    kill_at = int(os.environ["KILL_AT_STEP"])

    class Kill(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)  # no cleanup, no final save: a real crash

    import aot_transformers.training.lm as lm
    original = lm.prepare_lm_training
    lm.prepare_lm_training = lambda model, data, training, publish=None, callbacks=None, **kwargs: original(
        model, data, training, publish, [Kill()], **kwargs
    )
    sys.exit(main(sys.argv[1:]))
    """
)


def test_resume_after_sigkill_matches_an_uninterrupted_run(tmp_path, text_dir):
    common = [
        "--preset",
        "aot-mssa-l-tiny",
        "--config_overrides",
        TINY,
        "--tokenizer_vocab_size",
        "300",
        "--dataset_name",
        str(text_dir / "train.txt"),
        "--block_size",
        "32",
        "--max_steps",
        "8",
        "--per_device_train_batch_size",
        "4",
        "--learning_rate",
        "3e-3",
        "--save_strategy",
        "steps",
        "--save_steps",
        "3",
        "--report_to",
        "none",
        "--use_cpu",
        "--disable_tqdm",
        "true",
        "--seed",
        "0",
        "--eval_strategy",
        "no",
    ]
    env = {**os.environ, "KILL_AT_STEP": "5", "OMP_NUM_THREADS": "1"}
    killed = subprocess.run(
        [sys.executable, "-c", KILLER, *common, "--output_dir", str(tmp_path / "run")],
        env=env,
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert last_complete_checkpoint(tmp_path / "run").endswith("checkpoint-3")
    assert not (tmp_path / "run" / "model").exists()

    from aot_transformers.training.lm import main

    torch.set_num_threads(1)
    assert main([*common, "--output_dir", str(tmp_path / "run"), "--resume_from_checkpoint", "latest"]) == 0
    assert main([*common, "--output_dir", str(tmp_path / "straight")]) == 0
    resumed = AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "model").state_dict()
    straight = AutoModelForCausalLM.from_pretrained(tmp_path / "straight" / "model").state_dict()
    for name, value in straight.items():
        torch.testing.assert_close(resumed[name], value, rtol=1e-5, atol=1e-6, msg=name)
    state = json.loads((tmp_path / "run" / "checkpoint-8" / "trainer_state.json").read_text())
    assert state["global_step"] == 8


def test_module_entry_point_reports_setup_errors_cleanly(tmp_path):
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "aot_transformers.training.lm",
            "--output_dir",
            str(tmp_path / "x"),
            "--dataset_name",
            str(tmp_path / "missing.txt"),
        ],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
    )
    assert completed.returncode == 2
    assert "error: training data: no such file or folder" in completed.stderr
    assert "Traceback" not in completed.stderr


def test_run_object_exposes_trainer_before_training(tmp_path, text_dir):
    run = prepare_lm_training(
        tiny_model_args(tokenizer_vocab_size=300),
        TextDataArguments(dataset_name=str(text_dir / "train.jsonl"), block_size=32),
        training_args(tmp_path, max_steps=1),
    )
    assert run.trainer.state.global_step == 0
    assert run.source.documents  # jsonl examples are documents: separated by EOS
    metrics = run_lm_training(run)
    assert metrics["train_loss"] > 0


def test_cpu_training_uses_the_shared_projection_backend_for_mssa_only():
    from types import SimpleNamespace

    from aot_transformers import AoTForCausalLM
    from aot_transformers.training.model_setup import use_training_attention
    from support import tiny_config

    on_cpu = SimpleNamespace(use_cpu=True)
    chosen = {}
    for name, overrides in {"mssa": {}, "mhsa": {"attention_type": "mhsa"}, "knn": {"knn_k": 3}}.items():
        model = AoTForCausalLM(tiny_config(**overrides))
        use_training_attention(model, on_cpu)
        chosen[name] = model.config._attn_implementation
    assert chosen == {"mssa": "shared_projection", "mhsa": "sdpa", "knn": "knn"}


# --------------------------------------------------------------------------------------------------------------
# a dataset repository (Hub layout) and the packed blocks
# --------------------------------------------------------------------------------------------------------------


def write_dataset_repository(root: Path, splits: dict[str, list[str]], suffix: str = "parquet") -> Path:
    """A folder laid out as a Hub dataset repository: a card declaring `configs` and one shard per split (parquet or
    jsonl), written over what the folder holds."""
    import datasets

    (root / "data").mkdir(parents=True, exist_ok=True)
    for split, texts in splits.items():
        shard = root / "data" / f"{split}-00000-of-00001.{suffix}"
        if suffix == "jsonl":
            shard.write_text("".join(json.dumps({"text": text}) + "\n" for text in texts))
        else:
            datasets.Dataset.from_dict({"text": texts}).to_parquet(str(shard))
    files = "".join(f"  - split: {split}\n    path: data/{split}-*.{suffix}\n" for split in splits)
    (root / "README.md").write_text(f"---\nconfigs:\n- config_name: default\n  data_files:\n{files}---\n# A card\n")
    return root


def test_a_dataset_repository_folder_trains_validates_and_tests_on_its_own_splits(tmp_path):
    docs = embedded_corpus()
    splits = {"train": docs[:30], "validation": docs[30:34], "test": docs[34:37]}
    source = load_text_source(TextDataArguments(dataset_name=str(write_dataset_repository(tmp_path / "repo", splits))))
    assert source.train["text"] == splits["train"]  # neither the card nor another split's books
    assert source.validation["text"] == splits["validation"]  # not the train split's tail
    assert source.test["text"] == splits["test"]
    assert source.documents  # one row, one book: EOS between them
    streamed = load_text_source(TextDataArguments(dataset_name=str(tmp_path / "repo"), streaming=True))
    assert [row["text"] for row in streamed.train] == splits["train"]  # streamed, and nothing held out of it
    assert streamed.validation["text"] == splits["validation"] and streamed.test["text"] == splits["test"]


def test_a_repository_folder_whose_card_reads_json_documents_by_a_field_is_not_refused_as_json_lines(
    tmp_path, monkeypatch
):
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "cache"))
    docs = embedded_corpus()
    (tmp_path / "repo" / "data").mkdir(parents=True)
    for split, texts in (("train", docs[:5]), ("validation", docs[5:7])):
        rows = json.dumps({"rows": [{"text": text} for text in texts]}, indent=1)  # one document, many lines
        (tmp_path / "repo" / "data" / f"{split}.json").write_text(rows)
    files = "".join(f"  - split: {split}\n    path: data/{split}.json\n" for split in ("train", "validation"))
    card = f"---\nconfigs:\n- config_name: default\n  field: rows\n  data_files:\n{files}---\n"
    (tmp_path / "repo" / "README.md").write_text(card)
    source = load_text_source(TextDataArguments(dataset_name=str(tmp_path / "repo")))
    assert source.train["text"] == docs[:5] and source.validation["text"] == docs[5:7]


def _blocks_by_hand(tokenizer, texts: list[str], block_size: int) -> list[list[int]]:
    stream = [t for text in texts for t in tokenizer(text, add_special_tokens=False)["input_ids"] + [0]]
    return [stream[i : i + block_size] for i in range(0, len(stream) // block_size * block_size, block_size)]


def test_packing_is_one_stream_of_the_documents_whatever_the_workers_or_the_cache(tmp_path, monkeypatch):
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "cache"))
    tokenizer = train_bpe_tokenizer(corpus_lines(), vocab_size=300, show_progress=False)
    docs = embedded_corpus()[:40]
    repo = write_dataset_repository(tmp_path / "repo", {"train": docs, "validation": docs[:2]})
    file_backed = load_text_source(TextDataArguments(dataset_name=str(repo))).train
    in_memory = datasets.Dataset.from_dict({"text": docs})
    expected = _blocks_by_hand(tokenizer, docs, 64)
    for dataset, workers in ((in_memory, None), (in_memory, 2), (file_backed, 2), (file_backed, None)):
        packed = tokenize_and_pack(dataset, tokenizer, 64, "text", add_eos=True, num_proc=workers)
        assert packed["input_ids"] == expected and packed["labels"] == expected
    cached = list((tmp_path / "cache" / "aot_blocks").glob("*.arrow"))
    assert len(cached) == 1  # the file-backed blocks, keyed by data, tokenizer and block size; in-memory data is not
    # A second run reads the cached blocks without tokenizing anything.
    monkeypatch.setattr(type(tokenizer), "__call__", lambda *a, **k: pytest.fail("tokenized again"))
    assert tokenize_and_pack(file_backed, tokenizer, 64, "text", add_eos=True)["input_ids"] == expected


@pytest.mark.parametrize("suffix", ["parquet", "jsonl"])
def test_a_rewritten_shard_of_a_repository_folder_gives_its_new_rows_and_their_blocks(tmp_path, monkeypatch, suffix):
    """`datasets` (5.2) caches a repository folder by its name and card alone: a second load after a shard was
    rewritten gave the old rows without a word, and the blocks packed of them."""
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "cache"))
    tokenizer = train_bpe_tokenizer(corpus_lines(), vocab_size=300, show_progress=False)
    docs = embedded_corpus()
    for train in (docs[:10], docs[10:25]):  # the same folder, the same card: only the training shard changes
        repo = write_dataset_repository(tmp_path / "repo", {"train": train, "validation": docs[30:32]}, suffix)
        source = load_text_source(TextDataArguments(dataset_name=str(repo)))
        assert source.train["text"] == train
        packed = tokenize_and_pack(source.train, tokenizer, 64, "text", add_eos=True)
        assert packed["input_ids"] == _blocks_by_hand(tokenizer, train, 64)


def test_a_text_that_is_not_a_string_is_named_by_column_and_row():
    import datasets

    tokenizer = train_bpe_tokenizer(corpus_lines(), vocab_size=300, show_progress=False)
    data = datasets.Dataset.from_dict({"text": ["a book", "another", None, "more"]})
    with pytest.raises(TrainingSetupError, match=r"training text: row 2 of the text column 'text' holds NoneType"):
        tokenize_and_pack(data, tokenizer, 4, "text", add_eos=True, desc="training text")


def test_max_eval_samples_spreads_the_validation_blocks_over_the_whole_split():
    import datasets

    from aot_transformers.training.lm import spread

    blocks = datasets.Dataset.from_dict({"input_ids": [[i] for i in range(100)]})
    assert [row[0] for row in spread(blocks, 5)["input_ids"]] == [0, 25, 50, 74, 99]
    assert len(spread(blocks, 500)) == 100


# --------------------------------------------------------------------------------------------------------------
# baselines through the same command
# --------------------------------------------------------------------------------------------------------------

SIZES = "vocab_size=320,hidden_size=32,num_hidden_layers=2,num_attention_heads=4,max_position_embeddings=64"


@pytest.mark.parametrize(
    "model_type, cls_name", [("gpt2", "GPT2LMHeadModel"), ("llama", "LlamaForCausalLM"), ("aot", "AoTForCausalLM")]
)
def test_model_type_trains_transformers_own_baseline_from_the_same_size_fields(tmp_path, model_type, cls_name):
    data = TextDataArguments(block_size=32)
    args = LMModelArguments(model_type=model_type, preset="aot-mssa-l-tiny", config_overrides=SIZES)
    train_lm(args, data, training_args(tmp_path, max_steps=2))
    final = tmp_path / "run" / "model"
    model = AutoModelForCausalLM.from_pretrained(final, trust_remote_code=model_type == "aot")
    assert type(model).__name__ == cls_name
    config = model.config
    assert (config.hidden_size, config.num_hidden_layers, config.num_attention_heads) == (32, 2, 4)
    assert config.eos_token_id == AutoTokenizer.from_pretrained(final).eos_token_id  # not GPT-2's 50256
    if model_type != "aot":  # no remote code: transformers' own model, with the preset's 4x MLP
        assert not list(final.glob("*.py"))
        card = (final / "README.md").read_text()
        assert f"transformers' own `{cls_name}`" in card and "trust_remote_code" not in card
        mlp = config.n_inner if model_type == "gpt2" else config.intermediate_size
        assert mlp == (128 if model_type == "gpt2" else round(2 * 128 / 3))


def test_a_config_file_of_another_model_trains_that_model_or_is_refused(tmp_path):
    from transformers import BertConfig, GPT2Config

    GPT2Config(n_embd=32, n_layer=1, n_head=4, n_positions=64, vocab_size=320).save_pretrained(tmp_path / "gpt2")
    train_lm(
        LMModelArguments(config_file=str(tmp_path / "gpt2" / "config.json")),
        TextDataArguments(block_size=32),
        training_args(tmp_path, max_steps=1),
    )
    assert json.loads((tmp_path / "run" / "model" / "config.json").read_text())["model_type"] == "gpt2"
    BertConfig().save_pretrained(tmp_path / "bert")
    _fails_before_training(
        tmp_path / "b",
        LMModelArguments(config_file=str(tmp_path / "bert" / "config.json")),
        TextDataArguments(),
        r"is a 'bert' model; this task trains aot, gpt2, llama",
    )
    _fails_before_training(
        tmp_path / "c",
        LMModelArguments(model_type="vit"),
        TextDataArguments(),
        r"--model_type 'vit'.*aot, gpt2, llama",
    )


# --------------------------------------------------------------------------------------------------------------
# experiment trackers
# --------------------------------------------------------------------------------------------------------------


def _train_with_a_test_split(tmp_path, report_to: str) -> None:
    docs = [doc[:3000] for doc in embedded_corpus()[:16]]
    repo = write_dataset_repository(
        tmp_path / "repo", {"train": docs[:12], "validation": docs[12:14], "test": docs[14:]}
    )
    train_lm(
        tiny_model_args(tokenizer_vocab_size=300),
        TextDataArguments(dataset_name=str(repo), block_size=32),
        training_args(tmp_path, max_steps=2, report_to=report_to),
        PublishArguments(make_plots=False),
    )


def test_the_final_evaluations_go_to_the_tensorboard_run_of_the_training(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _train_with_a_test_split(tmp_path, "tensorboard")
    events = list((tmp_path / "run" / "runs").rglob("events.out.tfevents*"))
    assert len(events) == 1  # one writer from the first step to the test split (a second file: a second writer)
    run = EventAccumulator(str(events[0]))
    run.Reload()
    assert {"train/loss", "eval/loss", "eval/perplexity", "test/loss"} <= set(run.Tags()["scalars"])


def test_the_final_evaluations_go_to_the_trackio_run_of_the_training(tmp_path, monkeypatch):
    import importlib.machinery
    import types
    from unittest import mock

    trackio = types.ModuleType("trackio")  # a stand-in that records what the callback asks of trackio
    trackio.__spec__ = importlib.machinery.ModuleSpec("trackio", None)
    trackio.__version__ = "0.43.0"
    calls = []
    trackio.init = lambda **kwargs: calls.append("init")
    trackio.finish = lambda: calls.append("finish")
    trackio.log = lambda values, **kwargs: calls.append(" ".join(["log", *sorted({k.split("/")[0] for k in values})]))
    trackio.config = mock.MagicMock()
    trackio.context_vars = mock.MagicMock()
    trackio.context_vars.current_space_id.get.return_value = None
    monkeypatch.setitem(sys.modules, "trackio", trackio)
    _train_with_a_test_split(tmp_path, "trackio")
    assert calls[0] == "init" and calls[-1] == "finish"
    assert calls.count("init") == calls.count("finish") == 1  # one run, opened before training, closed after the test
    assert [call for call in calls if call.startswith("log")][-2:] == ["log eval train", "log test train"]
