"""Every cache and backend path gives the logits of the uncached forward, by value (float32, within 1e-5).

The paths and models live in `benchmarks/cache_paths.py`, which `benchmarks/bench_cache_equivalence.py` runs too
and tabulates. Each path — dynamic, static and offloaded caches (prefill + decode, chunked prefill, through direct
forward calls and through `generate`), left padding, compiled static decoding, beam search, assisted decoding,
continuous batching — is compared position by position with one uncached forward over the same full sequence, on
tiny AoT models (MSSA, MHSA; dense, k = 3, k = 0.5) and on Llama (grouped-query), GPT-2 and Mistral (sliding
window) with the package's k-NN backend. Greedy tokens of an untrained model are never the check: a 0.3 logit error
hides behind the same argmax.
"""

from __future__ import annotations

import logging

import pytest
from benchmarks.cache_paths import (
    MARGIN,
    MODELS,
    NAMES_KNN,
    NEW,
    PATHS,
    TOLERANCE,
    PathUnavailable,
    run_continuous_batching,
)

# Continuous batching has tests of its own below (it returns log-probabilities, not logits, and refuses k-NN).
VALUE_PATHS = [name for name, path in PATHS.items() if not path.slow and name != "continuous-batching"]
# Compiling takes seconds per model: the compiled paths run on a dense model, on k-NN with a fractional k (AoT)
# and on k-NN in another family with grouped-query attention; the benchmark runs every model.
COMPILED_CASES = [
    ("static-compiled-decode", "aot-mssa"),
    ("static-compiled-decode", "aot-mhsa-knn0.5"),
    ("static-compiled-decode", "llama-gqa-knn3"),
    ("static-compiled-generate", "aot-mssa"),
]
DENSE = [name for name, spec in MODELS.items() if not spec.knn]
KNN = [name for name, spec in MODELS.items() if spec.knn]


@pytest.fixture(autouse=True)
def _no_dynamo_trace_in_failure_reports(caplog):
    # A failing compile logs hundreds of DEBUG lines to `torch.__trace`; the failure's own message names the cause.
    caplog.set_level(logging.WARNING, logger="torch.__trace")


def _run(path: str, model: str):
    try:
        return PATHS[path].run(MODELS[model])
    except PathUnavailable as reason:
        pytest.skip(str(reason))


@pytest.mark.parametrize("path", VALUE_PATHS)
@pytest.mark.parametrize("model", list(MODELS))
def test_cached_path_logits_equal_the_uncached_forward(model, path):
    result = _run(path, model)
    assert result.max_diff <= TOLERANCE, f"{model}, {path} ({PATHS[path].what}): {result.summary()}"


@pytest.mark.parametrize("path, model", COMPILED_CASES, ids=[f"{m}-{p}" for p, m in COMPILED_CASES])
def test_compiled_static_decoding_logits_equal_the_uncached_forward(path, model):
    result = _run(path, model)
    assert result.max_diff <= TOLERANCE, f"{model}, {path} ({PATHS[path].what}): {result.summary()}"


@pytest.mark.parametrize("model", DENSE)
def test_continuous_batching_log_probabilities_and_tokens_equal_the_uncached_forward(model):
    # `generate_batch` returns no logits. Where transformers can return each token's log-probability
    # (`ContinuousBatchingConfig(return_logprobs=True)`), those are compared by value; the tokens are compared with
    # the uncached argmax, which means something only because every step's top-1 logit beats the second by more
    # than MARGIN (asserted here, so a seed that makes a near-tie cannot pass silently).
    result = _run("continuous-batching", model)
    notes = result.notes
    assert notes["min_margin"] > MARGIN, f"a near-tie ({notes['min_margin']:.2g}): token equality would mean nothing"
    assert not notes["token_mismatches"], notes["token_mismatches"]
    assert result.max_diff <= TOLERANCE, f"{model}, continuous batching: {result.summary()}"
    if notes["logprobs_compared"] == 0:
        pytest.skip("this transformers' continuous batching returns no log-probabilities: only tokens compared")
    assert notes["logprobs_compared"] == 3 * NEW


@pytest.mark.parametrize("model", KNN)
def test_continuous_batching_refuses_knn_attention_with_an_error_naming_it(model):
    # transformers' paged kernels attend densely: a k-NN model must not silently run there.
    with pytest.raises((ValueError, RuntimeError), match=NAMES_KNN):
        run_continuous_batching(MODELS[model].build(), [[5, 6, 7], [8, 9, 10, 11, 12]])
