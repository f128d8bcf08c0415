"""Log-likelihoods of texts under any causal language model: sliding windows, batching, greedy checks.

Two requests cover the suite:

- `rolling_loglikelihoods(texts)`: the log-likelihood of every token of each text. The text is preceded by the
  tokenizer's BOS token (or EOS when there is no BOS, as GPT-2 marks document boundaries) so its first token is
  scored too; without either, the first token is context only. A text longer than the window is scored with a
  sliding window: the first window scores its first `max_length` tokens, each later window ends `stride` tokens
  further and scores only those new tokens, seeing the `max_length - stride` tokens before them as context (the
  last window ends at the end of the text). Every token is scored exactly once; with `stride == max_length`
  (the default) the windows are those of lm-evaluation-harness's `loglikelihood_rolling`.
- `conditional_loglikelihoods(pairs)`: the log-likelihood of a continuation given a context, and whether greedy
  decoding from the context would produce exactly the continuation's tokens (each is the arg-max at its step —
  the same as running greedy generation for that many tokens). A context too long for the window is cut from
  the left, keeping the continuation whole.

Tokenisation follows lm-evaluation-harness for causal models, so the numbers agree with it: no special tokens
are added, and a (context, continuation) pair is encoded as a whole and split where the context's tokens end,
with whitespace that ends the context moved to the continuation.

Shape legend: B windows in a batch, T padded window length, K kept logit positions, V vocabulary, n scored tokens.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .data import EvaluationError

# Config fields that hold a model's context window, in the order lm-evaluation-harness reads them.
_WINDOW_FIELDS = ("n_positions", "max_position_embeddings", "n_ctx")
_UNSET_TOKENIZER_LENGTH = 10**9


@dataclass(frozen=True)
class Window:
    """One forward pass: `tokens[:-1]` go in, and the last `num_scored` of `tokens` are the scored targets."""

    tokens: tuple[int, ...]
    num_scored: int


@dataclass(frozen=True)
class WindowScore:
    """Sum of the target log-probabilities of a window, and whether every target was the arg-max prediction
    (False when the check was not asked for)."""

    loglikelihood: float
    is_greedy: bool


@dataclass(frozen=True)
class ContinuationScore:
    """Score of one continuation.

    Attributes:
        loglikelihood: Sum of the log-probabilities of the continuation's tokens given the context (nats).
        is_greedy: Greedy decoding from the context produces exactly these tokens.
        num_tokens: Number of continuation tokens.
        truncated: The context was cut from the left to fit the window.
    """

    loglikelihood: float
    is_greedy: bool
    num_tokens: int
    truncated: bool


@dataclass(frozen=True)
class RollingScore:
    """Log-likelihood of a whole text (nats) and the number of tokens it sums over."""

    loglikelihood: float
    num_tokens: int


def rolling_windows(tokens: Sequence[int], prefix_token_id: int | None, max_length: int, stride: int) -> list[Window]:
    """The sliding windows that score every token of `tokens` exactly once (see the module docstring).

    Args:
        tokens: The token ids of one text.
        prefix_token_id: Token placed before the text so its first token is scored; `None` leaves the first
            token unscored.
        max_length: Longest model input (the context window).
        stride: New tokens scored per window after the first, 1 <= stride <= max_length.

    Returns:
        The windows, in order.
    """
    if not 1 <= stride <= max_length:
        raise EvaluationError(f"`stride` must be in [1, max_length={max_length}], got {stride}.")
    sequence = ([prefix_token_id] if prefix_token_id is not None else []) + list(tokens)
    if len(sequence) < 2:
        return []
    end = min(max_length, len(sequence) - 1) + 1  # exclusive end of the scored positions of `sequence`
    windows = [Window(tuple(sequence[:end]), end - 1)]
    while end < len(sequence):
        new_end = min(end + stride, len(sequence))
        windows.append(Window(tuple(sequence[max(0, new_end - 1 - max_length) : new_end]), new_end - end))
        end = new_end
    return windows


def model_context_window(model: torch.nn.Module, tokenizer=None) -> int | None:
    """The longest input `model` accepts, from its config (or the tokenizer's `model_max_length`); None if unknown."""
    config = getattr(model, "config", None)
    for field in _WINDOW_FIELDS:
        value = getattr(config, field, None)
        if isinstance(value, int) and value > 0:
            return value
    length = getattr(tokenizer, "model_max_length", None)
    if isinstance(length, int) and 0 < length < _UNSET_TOKENIZER_LENGTH:
        return length
    return None


def _output_vocab_size(model: torch.nn.Module) -> int | None:
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    size = getattr(head, "out_features", None) or getattr(getattr(model, "config", None), "vocab_size", None)
    return int(size) if size else None


class LanguageModelScorer:
    """Scores texts with a causal LM in batches of windows.

    Args:
        model: Any causal LM returning `.logits` (B, T, V) — AoT, GPT-2, ... — in eval mode.
        tokenizer: Its tokenizer.
        max_length: Longest input; defaults to the model's context window. Larger than that window is an error
            (the position table has no entries beyond it).
        stride: Tokens scored per sliding window after the first; defaults to `max_length` (disjoint windows).
        batch_size: Windows per forward pass.
        bf16: Run the forward pass under bfloat16 autocast (log-probabilities are taken in float32).
        prefix_token_id: Token placed before each text for rolling scores; by default BOS, else EOS, else none.
        progress: Show a progress bar.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer,
        max_length: int | None = None,
        stride: int | None = None,
        batch_size: int = 8,
        bf16: bool = False,
        prefix_token_id: int | None | str = "auto",
        progress: bool = False,
    ):
        window = model_context_window(model, tokenizer)
        if max_length is None:
            if window is None:
                raise EvaluationError("cannot tell the model's context window from its config; pass `max_length`.")
            max_length = window
        if not isinstance(max_length, int) or max_length < 1:
            raise EvaluationError(f"`max_length` must be a positive int, got {max_length!r}.")
        if window is not None and max_length > window:
            raise EvaluationError(
                f"`max_length`={max_length} is longer than the model's context window ({window} positions); long "
                "texts are scored with a sliding window instead: lower `max_length` or set `stride`."
            )
        stride = max_length if stride is None else stride
        if not isinstance(stride, int) or not 1 <= stride <= max_length:
            raise EvaluationError(f"`stride` must be an int in [1, max_length={max_length}], got {stride!r}.")
        if not isinstance(batch_size, int) or batch_size < 1:
            raise EvaluationError(f"`batch_size` must be a positive int, got {batch_size!r}.")
        if prefix_token_id == "auto":
            prefix_token_id = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
        self.model = model
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.stride = stride
        self.batch_size = batch_size
        self.bf16 = bf16
        self.prefix_token_id = prefix_token_id
        self.progress = progress
        self.vocab_size = _output_vocab_size(model)
        self._takes_logits_to_keep = "logits_to_keep" in inspect.signature(model.forward).parameters
        self._device = next(model.parameters()).device

    # -- tokenisation ---------------------------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`, without special tokens; ids the model cannot embed raise `EvaluationError`."""
        ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        if self.vocab_size is not None and ids and max(ids) >= self.vocab_size:
            raise EvaluationError(
                f"the tokenizer produced id {max(ids)} but the model has {self.vocab_size} output classes: the "
                "tokenizer does not belong to this model."
            )
        return ids

    def encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """Token ids of a (context, continuation) pair, split where the context's own tokens end."""
        spaces = len(context) - len(context.rstrip())
        if spaces:
            context, continuation = context[:-spaces], context[-spaces:] + continuation
        whole = self.encode(context + continuation)
        context_ids = self.encode(context)
        return whole[: len(context_ids)], whole[len(context_ids) :]

    # -- requests -------------------------------------------------------------------------------------------------

    def rolling_loglikelihoods(self, texts: Sequence[str], description: str = "rolling") -> list[RollingScore]:
        """Log-likelihood of every token of each text (sliding windows; see the module docstring)."""
        windows, owners = [], []
        for index, text in enumerate(texts):
            for window in rolling_windows(self.encode(text), self.prefix_token_id, self.max_length, self.stride):
                windows.append(window)
                owners.append(index)
        totals = [0.0] * len(texts)
        counts = [0] * len(texts)
        scores = self.score_windows(windows, description, greedy=False)
        for owner, window, score in zip(owners, windows, scores, strict=True):
            totals[owner] += score.loglikelihood
            counts[owner] += window.num_scored
        return [RollingScore(total, count) for total, count in zip(totals, counts, strict=True)]

    def conditional_loglikelihoods(
        self, pairs: Sequence[tuple[str, str]], description: str = "loglikelihood"
    ) -> list[ContinuationScore]:
        """Log-likelihood of each continuation given its context, and whether greedy decoding produces it."""
        windows, truncated = [], []
        for context, continuation in pairs:
            context_ids, continuation_ids = self.encode_pair(context, continuation)
            if not continuation_ids:
                raise EvaluationError(f"empty continuation after tokenisation for context ending {context[-40:]!r}.")
            if not context_ids:
                if self.prefix_token_id is None:
                    raise EvaluationError("an empty context needs a BOS or EOS token to condition on.")
                context_ids = [self.prefix_token_id]
            if len(continuation_ids) > self.max_length:
                raise EvaluationError(
                    f"a continuation of {len(continuation_ids)} tokens does not fit the {self.max_length}-token "
                    f"window: {continuation[:60]!r}"
                )
            tokens = (context_ids + continuation_ids)[-(self.max_length + 1) :]
            truncated.append(len(context_ids) + len(continuation_ids) > self.max_length + 1)
            windows.append(Window(tuple(tokens), len(continuation_ids)))
        scores = self.score_windows(windows, description)
        return [
            ContinuationScore(score.loglikelihood, score.is_greedy, window.num_scored, cut)
            for score, window, cut in zip(scores, windows, truncated, strict=True)
        ]

    # -- the forward passes ---------------------------------------------------------------------------------------

    @torch.no_grad()
    def score_windows(
        self, windows: Sequence[Window], description: str = "scoring", greedy: bool = True
    ) -> list[WindowScore]:
        """Score windows in batches of similar length (longest first, so a memory error shows at once).

        Args:
            windows: The windows.
            description: Label of the progress bar.
            greedy: Also check whether each target is the arg-max (an extra pass over the logits; the rolling
                scores do not need it and report `is_greedy=False`).
        """
        order = sorted(range(len(windows)), key=lambda i: -len(windows[i].tokens))
        results: list[WindowScore | None] = [None] * len(windows)
        bar = _progress_bar(len(windows), description, self.progress)
        for start in range(0, len(order), self.batch_size):
            indices = order[start : start + self.batch_size]
            for index, score in zip(indices, self._score_batch([windows[i] for i in indices], greedy), strict=True):
                results[index] = score
            bar(len(indices))
        bar(0, close=True)
        return results  # type: ignore[return-value]

    def _score_batch(self, batch: Sequence[Window], greedy: bool) -> list[WindowScore]:
        lengths = [len(window.tokens) - 1 for window in batch]
        padded = max(lengths)
        # Right padding: a causal model never lets a real position see the padding after it.
        inputs = torch.zeros(len(batch), padded, dtype=torch.long)
        for row, window in enumerate(batch):
            inputs[row, : lengths[row]] = torch.tensor(window.tokens[:-1])
        # Only the positions that predict a target need logits (a few per row for the last-word and cloze tasks).
        keep = max(padded - length + window.num_scored for length, window in zip(lengths, batch, strict=True))
        kwargs = {"logits_to_keep": keep} if self._takes_logits_to_keep else {}
        autocast = torch.autocast(self._device.type, dtype=torch.bfloat16) if self.bf16 else nullcontext()
        with autocast:
            logits = self.model(input_ids=inputs.to(self._device), use_cache=False, **kwargs).logits
        logits = logits[:, -keep:]  # (B, K, V)

        # Targets laid out like the kept logits; positions that score nothing (context, padding) are masked out.
        targets = torch.zeros(len(batch), keep, dtype=torch.long)
        scored = torch.zeros(len(batch), keep, dtype=torch.bool)
        for row, (length, window) in enumerate(zip(lengths, batch, strict=True)):
            first = length - window.num_scored - (padded - keep)  # first scored position among the K kept
            targets[row, first : first + window.num_scored] = torch.tensor(window.tokens[-window.num_scored :])
            scored[row, first : first + window.num_scored] = True
        targets, scored = targets.to(logits.device), scored.to(logits.device)
        logprobs, is_greedy = _target_logprobs(logits, targets, greedy)  # (B, K), (B, K)
        logprobs = logprobs.double().masked_fill(~scored, 0.0).sum(dim=1)  # (B,)
        if greedy:
            is_greedy = (is_greedy | ~scored).all(dim=1)  # (B,)
        return [
            WindowScore(float(logprobs[row]), bool(is_greedy[row]) if greedy else False) for row in range(len(batch))
        ]


def _target_logprobs(logits: torch.Tensor, targets: torch.Tensor, greedy: bool, chunk: int = 4096):
    """log p(target) (B, K) in float32 and, when asked, whether the target is the arg-max (else None).

    One fused cross-entropy over all kept positions is much faster than one call per row; it runs over chunks of
    positions so the temporary log-softmax stays O(chunk · V).
    """
    batch, keep, vocab = logits.shape
    flat, flat_targets = logits.reshape(batch * keep, vocab), targets.reshape(-1)  # (B·K, V), (B·K,)
    logprobs, hits = [], []
    for start in range(0, flat.shape[0], chunk):
        part = flat[start : start + chunk].float()  # (n, V)
        target = flat_targets[start : start + chunk]
        logprobs.append(-F.cross_entropy(part, target, reduction="none"))
        if greedy:
            hits.append(part.argmax(dim=-1) == target)
    return torch.cat(logprobs).view(batch, keep), torch.cat(hits).view(batch, keep) if greedy else None


def _progress_bar(total: int, description: str, enabled: bool) -> Callable[..., None]:
    """A tqdm bar when enabled and installed; a no-op otherwise."""
    if not enabled or total == 0:
        return lambda n, close=False: None
    try:
        from tqdm.auto import tqdm
    except ImportError:  # tqdm is part of the `eval` extra; without it there is simply no bar
        return lambda n, close=False: None
    bar = tqdm(total=total, desc=description, unit="window", leave=False)

    def update(n: int, close: bool = False) -> None:
        bar.update(n)
        if close:
            bar.close()

    return update


def bits_per_byte(loglikelihood: float, num_bytes: int) -> float:
    """Negative log-likelihood in bits per UTF-8 byte: compares models with different tokenizers."""
    return -loglikelihood / (num_bytes * math.log(2)) if num_bytes else float("nan")


__all__ = [
    "ContinuationScore",
    "LanguageModelScorer",
    "RollingScore",
    "Window",
    "WindowScore",
    "bits_per_byte",
    "model_context_window",
    "rolling_windows",
]
