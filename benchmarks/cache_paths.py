"""Every cache and backend path of transformers decoding, checked by values against the uncached forward.

One implementation for `tests/test_cache_equivalence.py` (which asserts each difference is within `TOLERANCE`) and
`benchmarks/bench_cache_equivalence.py` (which records every difference in a table). A path runner feeds a tiny
float32 model through one way of decoding (a dynamic, static or offloaded cache; a chunked prefill; left padding;
a compiled decoding step; beam search; assisted decoding; continuous batching) and compares the logits it produced
at every position with the logits of one uncached forward over the same full sequence. Tokens are never compared
on their own: an untrained model's argmax hides logit errors of 0.3 and more.

    from benchmarks.cache_paths import MODELS, PATHS
    result = PATHS["static-decode"].run(MODELS["aot-mssa-knn3"])   # a Comparison: max |logit difference|, where

Models (all tiny: hidden 32, 4 heads, 2 layers, vocabulary 97, seeded, eval mode): AoT with MSSA and MHSA, dense
and k-NN (k = 3 and k = 0.5), and three transformers families with the package's k-NN backend
(`attn_implementation="knn"`): Llama with grouped-query attention, GPT-2 and Mistral with a sliding window.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from transformers import AutoModelForCausalLM, DynamicCache, GenerationConfig, StaticCache

import aot_transformers.knn  # noqa: F401  (registers the "knn" backend for every transformers model)
from aot_transformers import AoTConfig, AoTForCausalLM

from .peers import peer_model

TOLERANCE = 1e-5  # max |logit difference| (float32) a path may have against the uncached forward
MARGIN = 1e-3  # where only tokens can be compared, the top-1 logit must beat the second by more than this
VOCAB = 97
PROMPT = 7  # prompt length
NEW = 5  # tokens decoded after the prompt
MAX_CACHE_LEN = 32  # static caches
PAD = 0  # padding id (real tokens are drawn from [2, VOCAB))
# How a path that cannot serve k-NN attention must refuse it: an error whose message names it.
NAMES_KNN = re.compile(r"(?i)\bk-?nn\b")


class PathUnavailable(Exception):
    """The path cannot run on this machine (the message says why); nothing was compared."""


# --- models ---------------------------------------------------------------------------------------------------------

_NO_SPECIAL_TOKENS = dict(pad_token_id=PAD, bos_token_id=None, eos_token_id=None)  # decoding never stops early


def _aot(attention_type: str, knn_k: int | float | None = None, normalize_query: bool = False) -> AoTForCausalLM:
    config = AoTConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=64,
        attention_type=attention_type,
        knn_k=knn_k,
        normalize_query=normalize_query,
        **_NO_SPECIAL_TOKENS,
    )
    return AoTForCausalLM(config)


def _with_knn(model, knn_k: int | float):
    model.config.knn_k = knn_k
    model.set_attn_implementation("knn")
    return model


# The transformers models' sizes: hidden 32, 4 heads, 2 layers, as the AoT models.
_PEER_FIELDS = dict(
    vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=64
)


def _llama(knn_k):  # grouped-query attention: 4 query heads share 2 key/value heads
    fields = dict(intermediate_size=64, num_key_value_heads=2, **_NO_SPECIAL_TOKENS)
    return _with_knn(peer_model(AutoModelForCausalLM, "llama", **_PEER_FIELDS, **fields), knn_k)


def _gpt2(knn_k):
    return _with_knn(peer_model(AutoModelForCausalLM, "gpt2", **_PEER_FIELDS, **_NO_SPECIAL_TOKENS), knn_k)


def _mistral(knn_k):  # a sliding window shorter than the 12-token sequences: the window really cuts keys
    fields = dict(intermediate_size=64, num_key_value_heads=2, sliding_window=5, **_NO_SPECIAL_TOKENS)
    return _with_knn(peer_model(AutoModelForCausalLM, "mistral", **_PEER_FIELDS, **fields), knn_k)


@dataclass(frozen=True)
class ModelSpec:
    """A tiny model to run the paths on: `build(seed)` returns it in eval mode, float32, weights from `seed`."""

    name: str
    factory: Callable[[], torch.nn.Module]
    knn: bool
    family: str

    def build(self, seed: int = 0) -> torch.nn.Module:
        torch.manual_seed(seed)
        return self.factory().float().eval()


MODELS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec("aot-mssa", lambda: _aot("mssa", normalize_query=True), knn=False, family="aot"),
        ModelSpec("aot-mhsa", lambda: _aot("mhsa"), knn=False, family="aot"),
        ModelSpec("aot-mssa-knn3", lambda: _aot("mssa", knn_k=3, normalize_query=True), knn=True, family="aot"),
        ModelSpec("aot-mhsa-knn0.5", lambda: _aot("mhsa", knn_k=0.5), knn=True, family="aot"),
        ModelSpec("llama-gqa-knn3", lambda: _llama(3), knn=True, family="llama"),
        ModelSpec("gpt2-knn0.5", lambda: _gpt2(0.5), knn=True, family="gpt2"),
        ModelSpec("mistral-sliding5-knn3", lambda: _mistral(3), knn=True, family="mistral"),
    )
}


# --- comparisons ----------------------------------------------------------------------------------------------------


@dataclass
class Comparison:
    """The largest |difference| between the values of a path and of the uncached forward, and where it was."""

    max_diff: float = 0.0
    where: str = ""
    compared: int = 0  # logit rows (or scores) compared
    notes: dict = field(default_factory=dict)  # path-specific facts (e.g. the smallest top-1 margin)

    def add(self, got: torch.Tensor, expected: torch.Tensor, where: str) -> None:
        if got.shape != expected.shape:
            raise AssertionError(f"{where}: shape {tuple(got.shape)} != uncached {tuple(expected.shape)}")
        diff = (got.double() - expected.double()).abs()
        value = float(diff.max()) if diff.numel() else 0.0
        if math.isnan(value) or value > self.max_diff or not self.where:
            self.max_diff, self.where = (math.inf if math.isnan(value) else value), where
        self.compared += max(1, got.numel() // got.shape[-1]) if got.dim() else 1

    @property
    def ok(self) -> bool:
        return self.max_diff <= TOLERANCE

    def summary(self) -> str:
        return f"max |logit difference| {self.max_diff:.3g} at {self.where} ({self.compared} rows compared)"


def _tokens(batch: int, length: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(2, VOCAB, (batch, length), generator=generator)


@torch.no_grad()
def uncached_logits(model, ids: torch.Tensor) -> torch.Tensor:
    """The reference: one forward over the whole (unpadded) sequence, no cache."""
    return model(ids, use_cache=False).logits


@torch.no_grad()
def _feed(model, ids, cache, chunks, attention_mask=None, decode=None) -> torch.Tensor:
    """Run `ids` (B, T) through the model chunk by chunk (sizes `chunks`) on `cache`, as generate's steps do, and
    return the logits of every position (B, T, V). With `attention_mask` (B, T) the 2-D mask of the tokens seen so
    far and positions counted from each row's first real token are passed, as generate passes them. `decode`, if
    given, runs every chunk after the first (the prefill runs eagerly, as in generate's compiled decoding)."""
    logits, start = [], 0
    for number, size in enumerate(chunks):
        forward = decode if decode is not None and number > 0 else model
        stop = start + size
        kwargs = {"cache": cache, "use_cache": True}
        if attention_mask is not None:
            kwargs["attention_mask"] = attention_mask[:, :stop]
            kwargs["position_ids"] = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)[:, start:stop]
        logits.append(forward(ids[:, start:stop], **kwargs).logits)
        start = stop
    assert start == ids.shape[1], (chunks, ids.shape)
    return torch.cat(logits, dim=1)


def _static_cache(model):
    return StaticCache(config=model.config, max_cache_len=MAX_CACHE_LEN)


def _offloaded_cache(model):
    return DynamicCache(config=model.config, offloading=True)


def _dynamic_cache(model):
    return DynamicCache(config=model.config)


CACHES = {"dynamic": _dynamic_cache, "static": _static_cache, "offloaded": _offloaded_cache}


def _unavailable_on_cpu(error: BaseException) -> bool:
    return "CUDA" in str(error) or "cuda" in str(error)


def _run_or_unavailable(what: str, fn: Callable[[], object]):
    """Run `fn`; an error that says the path needs CUDA becomes `PathUnavailable` (only on a machine without it)."""
    try:
        return fn()
    except (AssertionError, RuntimeError) as error:
        if not torch.cuda.is_available() and _unavailable_on_cpu(error):
            reason = f"{what} needs CUDA on this transformers/torch ({type(error).__name__}: {error})"
            raise PathUnavailable(reason) from error
        raise


# --- paths: direct forward calls ------------------------------------------------------------------------------------


def _chunked(cache_kind: str, chunks: tuple[int, ...]):
    def run(spec: ModelSpec) -> Comparison:
        model = spec.build()
        ids = _tokens(2, sum(chunks), seed=1)
        cache = _run_or_unavailable(f"the {cache_kind} cache", lambda: CACHES[cache_kind](model))
        got = _run_or_unavailable(f"the {cache_kind} cache", lambda: _feed(model, ids, cache, chunks))
        expected = uncached_logits(model, ids)
        result = Comparison()
        start = 0
        for number, size in enumerate(chunks):
            stop = start + size
            label = "prefill" if number == 0 else f"chunk {number} ({size} token{'s' if size > 1 else ''})"
            result.add(got[:, start:stop], expected[:, start:stop], f"{label}, positions {start}-{stop - 1}")
            start = stop
        return result

    return run


def _left_padded_inputs(lengths=(PROMPT, 4)):
    """Two prompts of different lengths, left-padded into one batch with a 2-D mask, each followed by NEW tokens."""
    prompts = [_tokens(1, n, seed=10 + i)[0] for i, n in enumerate(lengths)]
    width = max(lengths)
    continuation = _tokens(len(lengths), NEW, seed=20)
    ids = torch.full((len(lengths), width + NEW), PAD)
    mask = torch.zeros_like(ids)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) : width] = prompt
        ids[row, width:] = continuation[row]
        mask[row, width - len(prompt) :] = 1
    return prompts, continuation, ids, mask, width


def _left_padded(cache_kind: str):
    def run(spec: ModelSpec) -> Comparison:
        model = spec.build()
        prompts, continuation, ids, mask, width = _left_padded_inputs()
        cache = CACHES[cache_kind](model)
        got = _feed(model, ids, cache, (width,) + (1,) * NEW, attention_mask=mask)
        result = Comparison()
        for row, prompt in enumerate(prompts):
            alone = uncached_logits(model, torch.cat([prompt, continuation[row]])[None])[0]
            real = got[row, width - len(prompt) :]
            result.add(real[: len(prompt)], alone[: len(prompt)], f"row {row} (prompt {len(prompt)}), prefill")
            for step in range(NEW):
                position = len(prompt) + step
                result.add(real[position], alone[position], f"row {row} (prompt {len(prompt)}), decode step {step}")
        return result

    return run


def compile_config():
    """Compile generate's decoding step on any device (transformers compiles by itself only on accelerators)."""
    from transformers import CompileConfig

    config = CompileConfig(fullgraph=True, dynamic=False)
    config._compile_all_devices = True
    return config


class CompileFailure(AssertionError):
    """`torch.compile(..., fullgraph=True)` could not compile a decoding step (a graph break or a data-dependent
    guard); the message keeps the error's first line and the line of user code that caused it."""


def _compile_failure(error: Exception, what: str) -> CompileFailure:
    lines = [line for line in str(error).splitlines() if line.strip()]
    user_code = [i for i, line in enumerate(lines) if line.lstrip().startswith("File ")]
    cause = " | ".join(line.strip() for line in lines[user_code[-1] : user_code[-1] + 2]) if user_code else ""
    return CompileFailure(f"{what}: {type(error).__name__}: {lines[0] if lines else ''} [{cause}]")


def _compiled_static_decode(spec: ModelSpec) -> Comparison:
    """Prefill eagerly into a StaticCache, then decode NEW tokens through `torch.compile(model.forward,
    fullgraph=True, dynamic=False)`, as generate's compiled decoding does."""
    model = spec.build()
    ids = _tokens(2, PROMPT + NEW, seed=1)
    torch._dynamo.reset()
    compiled = torch.compile(model.forward, fullgraph=True, dynamic=False)

    def decode(*args, **kwargs):
        try:
            return compiled(*args, **kwargs)
        except Exception as error:  # dynamo raises errors of many types; the message says which
            raise _compile_failure(error, "compiled decode step") from None

    got = _feed(model, ids, _static_cache(model), (PROMPT,) + (1,) * NEW, decode=decode)
    expected = uncached_logits(model, ids)
    result = Comparison()
    result.add(got[:, :PROMPT], expected[:, :PROMPT], "eager prefill")
    for position in range(PROMPT, PROMPT + NEW):
        result.add(got[:, position], expected[:, position], f"compiled decode step {position - PROMPT}")
    return result


# --- paths: generate ------------------------------------------------------------------------------------------------


def _greedy(model, prompt, attention_mask=None, **kwargs):
    with torch.no_grad():
        return model.generate(
            prompt,
            attention_mask=attention_mask if attention_mask is not None else torch.ones_like(prompt),
            max_new_tokens=NEW,
            min_new_tokens=NEW,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
            **kwargs,
        )


def _generate(cache_implementation: str | None, **extra):
    def run(spec: ModelSpec) -> Comparison:
        model = spec.build()
        prompt = _tokens(2, PROMPT, seed=2)
        kwargs = dict(extra)
        if cache_implementation is not None:
            kwargs["cache_implementation"] = cache_implementation
        try:
            out = _run_or_unavailable(
                f"cache_implementation={cache_implementation!r}", lambda: _greedy(model, prompt, **kwargs)
            )
        except PathUnavailable:
            raise
        except Exception as error:
            if "compile_config" in kwargs and "torch._dynamo" in type(error).__module__:
                raise _compile_failure(error, "generate's compiled decoding step") from None
            raise
        expected = uncached_logits(model, out.sequences)
        result = Comparison()
        for step, logits in enumerate(out.logits):
            result.add(logits, expected[:, PROMPT + step - 1], f"generate step {step}")
        return result

    return run


def _left_padded_generate(cache_implementation: str):
    def run(spec: ModelSpec) -> Comparison:
        model = spec.build()
        prompts, _, ids, mask, width = _left_padded_inputs()
        out = _greedy(model, ids[:, :width], attention_mask=mask[:, :width], cache_implementation=cache_implementation)
        result = Comparison()
        for row, prompt in enumerate(prompts):
            alone = uncached_logits(model, torch.cat([prompt, out.sequences[row, width:]])[None])[0]
            for step, logits in enumerate(out.logits):
                position = len(prompt) + step - 1
                result.add(logits[row], alone[position], f"row {row} (prompt {len(prompt)}), generate step {step}")
        return result

    return run


def _beam_search(spec: ModelSpec) -> Comparison:
    """Beam search (2 beams, both returned): each returned beam's per-step raw logits and log-probabilities (read
    through `beam_indices`) and its sequence score, recomputed from an uncached forward over the beam's sequence."""
    model = spec.build()
    prompt = _tokens(2, PROMPT, seed=3)
    beams, length_penalty = 2, 1.0
    with torch.no_grad():
        out = model.generate(
            prompt,
            attention_mask=torch.ones_like(prompt),
            max_new_tokens=NEW,
            min_new_tokens=NEW,
            do_sample=False,
            num_beams=beams,
            num_return_sequences=beams,
            length_penalty=length_penalty,
            output_scores=True,
            output_logits=True,
            return_dict_in_generate=True,
        )
    result = Comparison()
    for index, sequence in enumerate(out.sequences):
        expected = uncached_logits(model, sequence[None])[0]
        log_probs = torch.log_softmax(expected.double(), dim=-1)
        total, generated = 0.0, 0
        for step in range(len(out.logits)):
            row = int(out.beam_indices[index, step])
            if row < 0:  # the beam had finished
                break
            position = PROMPT + step - 1
            where = f"sequence {index}, step {step} (beam row {row})"
            result.add(out.logits[step][row], expected[position], f"{where}, logits")
            result.add(out.scores[step][row], log_probs[position].float(), f"{where}, log-probabilities")
            total += float(log_probs[position, sequence[PROMPT + step]])
            generated += 1
        score = torch.tensor(total / generated**length_penalty)
        result.add(out.sequences_scores[index].double()[None], score[None], f"sequence {index}, sequence score")
    return result


def _assisted(spec: ModelSpec) -> Comparison:
    """Assisted decoding with a second tiny model of the same family (other weights, so that some candidates are
    rejected and the cache is cropped): the target's logits equal the uncached forward on the produced sequence."""
    model, assistant = spec.build(seed=0), spec.build(seed=1)
    # Three candidates per round whatever the assistant's confidence (an untrained model's is always low), so the
    # target verifies several tokens per call on its cache, then crops the rejected ones.
    assistant.generation_config.num_assistant_tokens = 3
    assistant.generation_config.num_assistant_tokens_schedule = "constant"
    assistant.generation_config.assistant_confidence_threshold = 0.0
    prompt = _tokens(1, PROMPT, seed=4)  # assisted decoding takes one sequence at a time
    lengths = []  # tokens per call of the target: more than 1 where it verifies the assistant's candidates
    hook = model.register_forward_pre_hook(
        lambda module, args, kwargs: lengths.append(kwargs["input_ids"].shape[1]), with_kwargs=True
    )
    try:
        out = _greedy(model, prompt, assistant_model=assistant)
    finally:
        hook.remove()
    if lengths[0] <= PROMPT + 1 and max(lengths[1:], default=0) <= 1:  # the path must not degrade into greedy
        raise AssertionError(f"the target never verified several candidates: tokens per call {lengths}")
    expected = uncached_logits(model, out.sequences)
    result = Comparison(notes={"target_tokens_per_call": lengths})
    for step, logits in enumerate(out.logits):
        result.add(logits, expected[:, PROMPT + step - 1], f"generate step {step}")
    return result


# --- path: continuous batching --------------------------------------------------------------------------------------


def continuous_batching_config(**overrides):
    from transformers import ContinuousBatchingConfig

    fields = {f.name for f in dataclasses.fields(ContinuousBatchingConfig)}
    options = dict(num_blocks=16, page_size=16, max_batch_tokens=64)  # a cache sized for these tests
    if "return_logprobs" in fields:
        options["return_logprobs"] = True
    options.update(overrides)
    return ContinuousBatchingConfig(**options)


def run_continuous_batching(model, prompts: list[list[int]]):
    config = GenerationConfig(max_new_tokens=NEW, do_sample=False, eos_token_id=None, pad_token_id=PAD)
    return model.generate_batch(
        inputs=prompts,
        generation_config=config,
        continuous_batching_config=continuous_batching_config(),
        progress_bar=False,
    )


def _continuous_batching(spec: ModelSpec) -> Comparison:
    """`generate_batch` (paged cache, prompts of different lengths scheduled together).

    It returns the generated tokens and — where `ContinuousBatchingConfig(return_logprobs=True)` exists — each
    token's log-probability, but not the logits. So: every returned log-probability must equal the uncached
    forward's log-softmax at that token (a value check within TOLERANCE), and every token must be the uncached
    forward's argmax where the top-1 logit beats the second by more than MARGIN (`notes["min_margin"]`; the test
    asserts every step clears it, so that token equality means something).
    """
    model = spec.build()
    prompts = [_tokens(1, n, seed=30 + n)[0].tolist() for n in (3, PROMPT, 5)]
    outputs = run_continuous_batching(model, prompts)
    result = Comparison()
    margins, mismatches, logprobs_seen = [], [], 0
    for index, prompt in enumerate(prompts):
        output = outputs[f"req_{index}"]
        tokens = list(output.generated_tokens)
        if len(tokens) != NEW:
            raise AssertionError(f"request {index}: {len(tokens)} tokens generated, expected {NEW}")
        expected = uncached_logits(model, torch.tensor([prompt + tokens]))[0]
        log_probs = torch.log_softmax(expected.double(), dim=-1)
        returned = list(getattr(output, "logprobs", []) or [])
        for step, token in enumerate(tokens):
            position = len(prompt) + step - 1
            top = expected[position].topk(2)
            margins.append(float(top.values[0] - top.values[1]))
            if token != int(top.indices[0]) and margins[-1] > MARGIN:
                mismatches.append((index, step, token, int(top.indices[0])))
            if returned:
                logprobs_seen += 1
                result.add(
                    torch.tensor([returned[step]], dtype=torch.float64),
                    log_probs[position, token][None],
                    f"request {index} (prompt {len(prompt)}), step {step}, log-probability",
                )
    result.notes.update(
        min_margin=min(margins),
        token_mismatches=mismatches,
        logprobs_compared=logprobs_seen,
    )
    if mismatches:  # a token the uncached forward would not pick, by a clear margin: report it as a difference
        result.max_diff, result.where = math.inf, f"tokens differ from the uncached argmax at {mismatches}"
    return result


# --- the table ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Path:
    name: str
    run: Callable[[ModelSpec], Comparison]
    what: str
    slow: bool = False  # compiles: the test runs it on a subset of models


PATHS: dict[str, Path] = {
    path.name: path
    for path in (
        Path("dynamic-decode", _chunked("dynamic", (PROMPT,) + (1,) * NEW), "DynamicCache: prefill 7, decode 5"),
        Path("dynamic-chunked-prefill", _chunked("dynamic", (4, 3)), "DynamicCache: prefill 4, then 3 at once"),
        Path("dynamic-generate", _generate(None), "generate, default (dynamic) cache"),
        Path("static-decode", _chunked("static", (PROMPT,) + (1,) * NEW), "StaticCache(32): prefill 7, decode 5"),
        Path("static-chunked-prefill", _chunked("static", (4, 3)), "StaticCache(32): prefill 4, then 3 at once"),
        Path("static-generate", _generate("static"), "generate(cache_implementation='static')"),
        Path(
            "offloaded-decode",
            _chunked("offloaded", (PROMPT,) + (1,) * NEW),
            "DynamicCache(offloading=True): prefill 7, decode 5",
        ),
        Path("offloaded-generate", _generate("offloaded"), "generate(cache_implementation='offloaded')"),
        Path("left-padded-dynamic", _left_padded("dynamic"), "prompts 7 + 4 left-padded, 2-D mask, DynamicCache"),
        Path("left-padded-static", _left_padded("static"), "prompts 7 + 4 left-padded, 2-D mask, StaticCache(32)"),
        Path("left-padded-dynamic-generate", _left_padded_generate("dynamic"), "generate, left-padded, dynamic"),
        Path("left-padded-static-generate", _left_padded_generate("static"), "generate, left-padded, static"),
        Path(
            "static-compiled-decode",
            _compiled_static_decode,
            "StaticCache(32), decode steps through torch.compile(forward, fullgraph=True, dynamic=False)",
            slow=True,
        ),
        Path(
            "static-compiled-generate",
            _generate("static", compile_config=compile_config()),
            "generate(cache_implementation='static', compile_config=CompileConfig(fullgraph=True))",
            slow=True,
        ),
        Path("beam-search", _beam_search, "generate(num_beams=2): logits, log-probs and sequence scores"),
        Path("assisted-decoding", _assisted, "generate(assistant_model=another tiny model of the family)"),
        Path(
            "continuous-batching",
            _continuous_batching,
            "generate_batch (paged cache): log-probabilities, and tokens where the margin allows",
        ),
    )
}


__all__ = [
    "MARGIN",
    "MODELS",
    "NAMES_KNN",
    "PATHS",
    "TOLERANCE",
    "Comparison",
    "ModelSpec",
    "Path",
    "PathUnavailable",
    "run_continuous_batching",
    "uncached_logits",
]
