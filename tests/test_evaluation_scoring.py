"""The scorer and the task numbers against hand computations (a model whose logits we set) and brute force."""

from __future__ import annotations

import math
import sys

import pytest
import torch

from aot_transformers.evaluation import EvaluationError, LanguageModelScorer, rolling_windows, run_task
from aot_transformers.evaluation.data import ClozeExample
from aot_transformers.evaluation.tasks import lambada_split
from support import char_tokenizer, preference_lm, tiny_aot, token_logprobs

TOKENIZER = char_tokenizer()
V = len(TOKENIZER)


def ids(text: str) -> list[int]:
    return TOKENIZER(text, add_special_tokens=False)["input_ids"]


def chain(text: str, start: int | None = None) -> dict[int, int]:
    """Preferences that make greedy decoding spell `text` after token `start` (default: text's first token)."""
    tokens = ([start] if start is not None else []) + ids(text)
    return dict(zip(tokens[:-1], tokens[1:], strict=True))


# ------------------------------------------------------------------------------------------------------------------
# Windows


@pytest.mark.parametrize("length", [0, 1, 5, 16, 17, 40, 63])
@pytest.mark.parametrize("max_length,stride", [(16, 16), (16, 5), (16, 1), (7, 3)])
def test_rolling_windows_are_the_inputs_lm_eval_feeds_its_model(length, max_length, stride):
    """Our windows are lm-evaluation-harness's rolling windows with context_len = max_length − stride + 1, laid out
    as its `_loglikelihood_tokens` feeds them to the model (the last max_length + 1 tokens of context + target)."""
    from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

    tokens = list(range(100, 100 + length))
    ours = [
        (list(w.tokens[:-1]), list(w.tokens[-w.num_scored :])) for w in rolling_windows(tokens, 0, max_length, stride)
    ]
    theirs = []
    for context, predicted in map(
        make_disjoint_window, get_rolling_token_windows(tokens, 0, max_length, max_length - stride + 1)
    ):
        whole = (context + predicted)[-(max_length + 1) :]
        theirs.append((whole[:-1], predicted))
    assert ours == theirs


@pytest.mark.parametrize("stride", [16, 9, 1])
def test_rolling_windows_score_each_token_once_with_enough_context(stride):
    tokens = list(range(50))
    windows = rolling_windows(tokens, prefix_token_id=99, max_length=16, stride=stride)
    scored = [t for w in windows for t in w.tokens[-w.num_scored :]]
    assert scored == tokens  # every token once, in order (the prefix is never a target)
    for window in windows[1:]:
        assert len(window.tokens) - 1 == 16  # later windows are full
        assert len(window.tokens) - 1 - window.num_scored >= 16 - stride  # context before the new tokens


def test_rolling_windows_without_prefix_skip_the_first_token():
    windows = rolling_windows([5, 6, 7], prefix_token_id=None, max_length=8, stride=8)
    assert [(w.tokens, w.num_scored) for w in windows] == [((5, 6, 7), 2)]
    assert rolling_windows([5], prefix_token_id=None, max_length=8, stride=8) == []
    assert rolling_windows([], prefix_token_id=None, max_length=8, stride=8) == []
    # a long text: the first token plays the part of the prefix token
    long = rolling_windows(list(range(20)), prefix_token_id=None, max_length=8, stride=3)
    assert [t for w in long for t in w.tokens[-w.num_scored :]] == list(range(1, 20))
    assert long == rolling_windows(list(range(1, 20)), prefix_token_id=0, max_length=8, stride=3)


def test_rolling_windows_without_lm_eval_say_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "lm_eval.utils", None)  # as if lm-evaluation-harness were not installed
    with pytest.raises(EvaluationError, match=r"aot-transformers\[eval\]"):
        rolling_windows([5, 6, 7], prefix_token_id=0, max_length=8, stride=8)


# ------------------------------------------------------------------------------------------------------------------
# Perplexity tasks by hand


def test_perplexity_metrics_by_hand():
    """'abcab': with preferences a→b, b→c the hits are a→b (twice) and b→c; EOS→a and c→a miss."""
    model = preference_lm(V, max_length=4, pairs={ids("a")[0]: ids("b")[0], ids("b")[0]: ids("c")[0]})
    scorer = LanguageModelScorer(model, TOKENIZER, max_length=4, stride=2)
    result = run_task(scorer, "ptb", ["abcab"])
    # targets a|EOS (miss), b|a (hit), c|b (hit), a|c (miss), b|a (hit) — windows do not matter for a bigram
    loglikelihood = 3 * model.logprob(True) + 2 * model.logprob(False)
    assert result.counts["tokens"] == 5
    assert result.metrics["loss"] == pytest.approx(-loglikelihood / 5, rel=1e-6)
    assert result.metrics["perplexity"] == pytest.approx(math.exp(-loglikelihood / 5), rel=1e-6)
    assert result.metrics["bits_per_byte"] == pytest.approx(-loglikelihood / (5 * math.log(2)), rel=1e-6)
    assert result.metrics["word_perplexity"] == pytest.approx(math.exp(-loglikelihood / 1), rel=1e-6)


def test_perplexity_counts_every_token_of_every_document_once():
    model = preference_lm(V, max_length=8)  # nothing preferred: every token costs the same
    documents = ["hello world, " * 7, "x", "two words"]
    scorer = LanguageModelScorer(model, TOKENIZER, max_length=8, stride=3, batch_size=2)
    result = run_task(scorer, "wikitext", documents)
    tokens = sum(len(doc) for doc in documents)  # one token per character, all scored thanks to the EOS prefix
    assert result.counts["tokens"] == tokens
    assert result.counts["bytes"] == tokens
    assert result.metrics["loss"] == pytest.approx(-model.logprob(False), rel=1e-6)


def test_sliding_window_loss_equals_one_shot_loss_when_the_text_fits():
    model = tiny_aot(V, max_length=64)
    text = "the cat sat on the mat."
    one_shot = token_logprobs(model, [0] + ids(text))  # one forward pass over EOS + text
    expected = sum(float(one_shot[i, t]) for i, t in enumerate(ids(text)))
    for stride in (64, 10, 1):
        scorer = LanguageModelScorer(model, TOKENIZER, stride=stride)
        (score,) = scorer.rolling_loglikelihoods([text])
        assert score.num_tokens == len(text)
        assert score.loglikelihood == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("stride", [16, 6])
def test_sliding_window_equals_brute_force_over_its_contexts(stride):
    """A 50-token text in a 16-token window: each token scored from exactly the context its window gives."""
    model = tiny_aot(V, max_length=16)
    text = "it was the best of times, it was the worst of times"
    sequence = [0] + ids(text)
    expected = 0.0
    for window in rolling_windows(ids(text), 0, 16, stride):
        inputs = list(window.tokens[:-1])
        logprobs = token_logprobs(model, inputs)
        targets = window.tokens[-window.num_scored :]
        positions = range(len(inputs) - window.num_scored, len(inputs))
        expected += sum(float(logprobs[p, t]) for p, t in zip(positions, targets, strict=True))
    scorer = LanguageModelScorer(model, TOKENIZER, stride=stride, batch_size=3)
    (score,) = scorer.rolling_loglikelihoods([text])
    assert score.num_tokens == len(sequence) - 1
    assert score.loglikelihood == pytest.approx(expected, rel=1e-5)


def test_batching_with_padding_does_not_change_scores():
    model = tiny_aot(V, max_length=32)
    texts = ["a", "short one", "a somewhat longer text than the others, to pad against"]
    one = LanguageModelScorer(model, TOKENIZER, batch_size=1).rolling_loglikelihoods(texts)
    many = LanguageModelScorer(model, TOKENIZER, batch_size=8).rolling_loglikelihoods(texts)
    for a, b in zip(one, many, strict=True):
        assert a.num_tokens == b.num_tokens
        assert a.loglikelihood == pytest.approx(b.loglikelihood, rel=1e-5)


def test_bf16_autocast_runs_and_is_close():
    model = tiny_aot(V, max_length=32)
    text = ["a few words of text"]
    exact = LanguageModelScorer(model, TOKENIZER).rolling_loglikelihoods(text)[0].loglikelihood
    bf16 = LanguageModelScorer(model, TOKENIZER, bf16=True).rolling_loglikelihoods(text)[0].loglikelihood
    assert bf16 == pytest.approx(exact, rel=5e-2)


# ------------------------------------------------------------------------------------------------------------------
# LAMBADA last word


def test_lambada_split_takes_the_last_space_separated_word():
    assert lambada_split("he said hello, Harlin") == ("he said hello,", " Harlin")
    assert lambada_split("one\ntwo three\nfour") == ("one\ntwo", " three\nfour")  # as lm-eval: split on spaces only


def greedy_decode(model, context: list[int], steps: int) -> list[int]:
    """Plain greedy generation, one token at a time (independent of the scorer)."""
    sequence = list(context)
    for _ in range(steps):
        with torch.no_grad():
            sequence.append(int(model(input_ids=torch.tensor([sequence])).logits[0, -1].argmax()))
    return sequence[len(context) :]


def test_lambada_accuracy_needs_every_token_of_a_multi_token_word():
    """Last words ' dog' and ' cat' (4 tokens each); the model spells ' dog' after 'a' (a→' ', ' '→d, d→o, o→g)."""
    passages = ["the farmer had a dog", "the old woman had a cat"]
    model = preference_lm(V, max_length=64, pairs=chain(" dog", start=ids("a")[-1]))
    scorer = LanguageModelScorer(model, TOKENIZER)
    result = run_task(scorer, "lambada_acc", passages)
    assert result.metrics["acc"] == 0.5
    assert result.counts["multi_token_targets"] == 2
    # the same verdict as running greedy generation for as many tokens as the word has
    for passage, correct in zip(passages, (True, False), strict=True):
        context, target = lambada_split(passage)
        assert (greedy_decode(model, ids(context), len(ids(target))) == ids(target)) is correct
    # last-word perplexity by hand: ' dog' = 4 hits; ' cat' = ' '|a hit, then c|' ', a|c, t|a all miss
    dog = 4 * model.logprob(True)
    cat = model.logprob(True) + 3 * model.logprob(False)
    assert result.metrics["last_word_perplexity"] == pytest.approx(math.exp(-(dog + cat) / 2), rel=1e-6)


def test_lambada_partial_word_is_wrong():
    """Greedy decoding gets ' d' and 'o' right but not 'g': wrong, although the first tokens are right."""
    pairs = chain(" do", start=ids("a")[-1])
    model = preference_lm(V, max_length=64, pairs=pairs)
    result = run_task(LanguageModelScorer(model, TOKENIZER), "lambada_acc", ["she had a dog"])
    assert result.metrics["acc"] == 0.0


def test_long_context_is_cut_from_the_left_keeping_the_word():
    model = tiny_aot(V, max_length=16)
    scorer = LanguageModelScorer(model, TOKENIZER)
    context, target = "a context that is much longer than sixteen characters", " word"
    (score,) = scorer.conditional_loglikelihoods([(context, target)])
    assert score.truncated and score.num_tokens == len(target)
    tokens = (ids(context) + ids(target))[-17:]
    logprobs = token_logprobs(model, tokens[:-1])
    expected = sum(float(logprobs[11 + i, t]) for i, t in enumerate(ids(target)))
    assert score.loglikelihood == pytest.approx(expected, rel=1e-5)


# ------------------------------------------------------------------------------------------------------------------
# CBT


def cloze(question: str, answer: str, candidates: list[str]) -> ClozeExample:
    return ClozeExample(tuple(f"sentence {i} ." for i in range(1, 21)), question, answer, tuple(candidates))


def test_cloze_scoring_pair_fills_the_blank():
    example = cloze("`` Run , '' said XXXXX to the dog .", "Tom", ["Tom", "Ann"])
    context, continuation = example.scoring_pair("Ann")
    assert context.endswith("sentence 20 . `` Run , '' said")
    assert continuation == " Ann to the dog ."
    assert context + continuation == example.context + " `` Run , '' said Ann to the dog ."


def test_cloze_accuracy_by_hand():
    """The model spells ' ox' after 'd'; the question 'I had XXXXX' picks 'ox' over 'ax' and 'oz'."""
    examples = [cloze("I had XXXXX", "ox", ["ax", "ox", "oz"]), cloze("I had XXXXX", "ax", ["ax", "ox", "oz"])]
    model = preference_lm(V, max_length=512, pairs=chain(" ox", start=ids("d")[0]))
    result = run_task(LanguageModelScorer(model, TOKENIZER), "cbt_cn", examples)
    # candidate lls: ' ox' = 3 hits; ' ax' = hit, miss, miss; ' oz' = hit, hit, miss → argmax 'ox' for both questions
    assert result.metrics["acc"] == 0.5
    assert result.metrics["acc_norm"] == 0.5
    assert result.counts == {"examples": 2, "candidates": 6, "truncated_contexts": 0}


def test_cloze_ties_go_to_the_first_candidate():
    examples = [cloze("XXXXX", "b", ["a", "b"])]  # a uniform model: equal scores
    model = preference_lm(V, max_length=512)
    assert run_task(LanguageModelScorer(model, TOKENIZER), "cbt_ne", examples).metrics["acc"] == 0.0


# ------------------------------------------------------------------------------------------------------------------
# Bad settings


def test_max_length_beyond_the_model_window_is_an_error():
    model = tiny_aot(V, max_length=16)
    with pytest.raises(EvaluationError, match="longer than the model's context window"):
        LanguageModelScorer(model, TOKENIZER, max_length=32)
    with pytest.raises(EvaluationError, match="stride"):
        LanguageModelScorer(model, TOKENIZER, stride=17)


def test_continuation_longer_than_the_window_is_an_error():
    scorer = LanguageModelScorer(tiny_aot(V, max_length=16), TOKENIZER)
    with pytest.raises(EvaluationError, match="does not fit"):
        scorer.conditional_loglikelihoods([("context", " " + "x" * 40)])


def test_tokenizer_of_another_model_is_an_error():
    scorer = LanguageModelScorer(tiny_aot(vocab_size=50, max_length=16), TOKENIZER)
    with pytest.raises(EvaluationError, match="does not belong to this model"):
        scorer.rolling_loglikelihoods(["xyz"])
