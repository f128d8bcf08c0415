"""lm-evaluation-harness, run through its Python API on our task folder, gives our numbers on the same data.

Accuracies must be equal, log-likelihood metrics equal to 1e-4 relative — per task and per example. Two tiny
models with the GPT-2 tokenizer: a random AoT with a 64-token window (so documents need several windows and
contexts are cut) and a bigram model whose preferences make some last words and CBT answers right (so the
accuracies are neither 0 nor 1).
"""

from __future__ import annotations

import logging

import pytest

from aot_transformers.evaluation import evaluate_model, lm_eval_tasks_path, read_cbt, read_lambada
from aot_transformers.evaluation.tasks import TASKS, lambada_split
from support import FIXTURES, SHARED_DATA, preference_lm, tiny_aot

lm_eval = pytest.importorskip("lm_eval")

WINDOW = 64
OUR_TASKS = ["wikitext", "ptb", "lambada", "lambada_acc", "cbt_cn", "cbt_ne"]


@pytest.fixture(scope="module")
def gpt2_tokenizer():
    from transformers import GPT2TokenizerFast

    folder = SHARED_DATA / "tokenizer-gpt2"
    if not folder.exists():
        pytest.skip(f"GPT-2 tokenizer not found at {folder}")
    return GPT2TokenizerFast.from_pretrained(folder)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    dev = SHARED_DATA / "eval-dev"
    if not dev.exists():
        pytest.skip(f"dev samples not found at {dev}")
    folder = tmp_path_factory.mktemp("lm_eval_data")
    # small slices of the dev samples, written at test time (the shared data is never copied into the repo)
    ptb = folder / "ptb.valid.txt"
    ptb.write_text("".join((dev / "ptb" / "ptb.valid.txt").read_text().splitlines(keepends=True)[:40]))
    lambada = folder / "lambada_dev12.jsonl"
    lambada.write_text("".join((dev / "lambada" / "lambada_dev100.jsonl").read_text().splitlines(keepends=True)[:12]))
    return {
        "wikitext": str(FIXTURES / "wiki.test.raw"),
        "ptb": str(ptb),
        "lambada": str(lambada),
        "cbt_cn": str(FIXTURES / "cbtest_CN_test_fixture.txt"),
        "cbt_ne": str(FIXTURES / "cbtest_NE_test_fixture.txt"),
    }


def lm_eval_results(model, tokenizer, data: dict[str, str]) -> dict:
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    logging.getLogger("lm-eval").setLevel(logging.ERROR)
    manager = TaskManager(include_path=str(lm_eval_tasks_path()), include_defaults=False, metadata=data)
    harness_model = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=4, device="cpu", max_length=WINDOW)
    return lm_eval.simple_evaluate(
        model=harness_model,
        tasks=[TASKS[name].lm_eval_task for name in OUR_TASKS],
        task_manager=manager,
        num_fewshot=0,
        log_samples=True,
        bootstrap_iters=0,
    )


def assert_same_numbers(ours, theirs) -> None:
    results, samples = theirs["results"], theirs["samples"]
    for task in ("wikitext", "ptb", "lambada"):
        harness = results[TASKS[task].lm_eval_task]
        for metric in ("bits_per_byte", "word_perplexity", "byte_perplexity"):
            assert ours.results[task][metric] == pytest.approx(harness[f"{metric},none"], rel=1e-4), (task, metric)
    harness = results["aot_lambada"]
    assert ours.results["lambada_acc"]["acc"] == harness["acc,none"]
    assert ours.results["lambada_acc"]["last_word_perplexity"] == pytest.approx(harness["perplexity,none"], rel=1e-4)
    for task in ("cbt_cn", "cbt_ne"):
        harness = results[TASKS[task].lm_eval_task]
        assert ours.results[task]["acc"] == harness["acc,none"]
        assert ours.results[task]["acc_norm"] == harness["acc_norm,none"]
    # the harness saw the same documents and examples as we did
    assert len(samples["aot_ptb"]) == ours.results["ptb"]["documents"]
    assert len(samples["aot_lambada"]) == ours.results["lambada_acc"]["examples"]
    assert len(samples["aot_cbt_cn"]) == ours.results["cbt_cn"]["examples"]


def test_lm_eval_agrees_on_a_random_aot(gpt2_tokenizer, data):
    model = tiny_aot(vocab_size=len(gpt2_tokenizer), max_length=WINDOW, hidden_size=32)
    ours = evaluate_model(model, OUR_TASKS, tokenizer=gpt2_tokenizer, data=data, batch_size=3)
    assert ours.results["ptb"]["tokens"] > 4 * WINDOW  # several windows
    assert ours.results["cbt_cn"]["truncated_contexts"] > 0  # contexts cut to the window
    assert_same_numbers(ours, lm_eval_results(model, gpt2_tokenizer, data))


def test_lm_eval_agrees_on_accuracies_between_zero_and_one(gpt2_tokenizer, data):
    """Preferences spell the last word of half the LAMBADA passages and the answer of the first CBT questions."""

    def encode(text):
        return gpt2_tokenizer(text, add_special_tokens=False)["input_ids"]

    pairs = {}
    for passage in read_lambada(data["lambada"])[::2]:
        context, target = lambada_split(passage)
        tokens = encode(context)[-1:] + encode(context + target)[len(encode(context)) :]
        pairs.update(zip(tokens[:-1], tokens[1:], strict=True))
    for task in ("cbt_cn", "cbt_ne"):
        example = read_cbt(data[task])[0]
        context, continuation = example.scoring_pair(example.answer)
        tokens = encode(context)[-1:] + encode(context + continuation)[len(encode(context)) :]
        pairs.update(zip(tokens[:-1], tokens[1:], strict=True))
    model = preference_lm(vocab_size=len(gpt2_tokenizer), max_length=WINDOW, pairs=pairs)

    ours = evaluate_model(model, OUR_TASKS, tokenizer=gpt2_tokenizer, data=data)
    assert 0 < ours.results["lambada_acc"]["acc"] < 1
    assert ours.results["cbt_cn"]["acc"] > 0 or ours.results["cbt_ne"]["acc"] > 0
    assert_same_numbers(ours, lm_eval_results(model, gpt2_tokenizer, data))


def test_task_folder_defines_every_task_and_the_group():
    from lm_eval.tasks import TaskManager

    manager = TaskManager(include_path=str(lm_eval_tasks_path()), include_defaults=False)
    names = set(manager.all_tasks)
    assert {TASKS[name].lm_eval_task for name in TASKS} | {"aot_suite"} <= names


@pytest.mark.slow
def test_lm_eval_agrees_on_the_full_dev_samples(gpt2_tokenizer):
    """The whole PTB validation split (~90k tokens, one document) and the 100 LAMBADA dev passages.

    Run with: .venv/bin/pytest -m slow tests/test_evaluation_lm_eval.py   (a few minutes on 2 cores)
    """
    dev = SHARED_DATA / "eval-dev"
    if not dev.exists():
        pytest.skip(f"dev samples not found at {dev}")
    data = {
        "ptb": str(dev / "ptb" / "ptb.valid.txt"),
        "lambada": str(dev / "lambada" / "lambada_dev100.jsonl"),
        "wikitext": str(FIXTURES / "wiki.test.raw"),
        "cbt_cn": str(FIXTURES / "cbtest_CN_test_fixture.txt"),
        "cbt_ne": str(FIXTURES / "cbtest_NE_test_fixture.txt"),
    }
    model = tiny_aot(vocab_size=len(gpt2_tokenizer), max_length=WINDOW, hidden_size=32)
    ours = evaluate_model(model, OUR_TASKS, tokenizer=gpt2_tokenizer, data=data, batch_size=8)
    assert ours.results["ptb"]["tokens"] > 80_000
    assert_same_numbers(ours, lm_eval_results(model, gpt2_tokenizer, data))
