"""Log-likelihoods of texts under any causal language model: lm-evaluation-harness's windows, batched.

Two requests cover the suite:

- `rolling_loglikelihoods(texts)`: the log-likelihood of every token of each text, in the windows of
  lm-evaluation-harness's `loglikelihood_rolling`, made by its own `lm_eval.utils.get_rolling_token_windows` and
  `make_disjoint_window` (so the two cannot drift). The text is preceded by the tokenizer's BOS token (or EOS when
  there is no BOS, as GPT-2 marks document boundaries) so its first token is scored too; without either, the first
  token is context only. The first window scores the first `max_length` tokens; each later window scores the next
  `stride` tokens with the `max_length - stride` tokens before them as context (lm-eval's `context_len` is
  `max_length - stride + 1`; the default `stride == max_length` gives lm-eval's disjoint windows). Every token is
  scored exactly once.
- `conditional_loglikelihoods(pairs)`: the log-likelihood of a continuation given a context, and whether greedy
  decoding from the context would produce exactly the continuation's tokens (each is the arg-max at its step —
  the same as running greedy generation for that many tokens). A context too long for the window is cut from
  the left, keeping the continuation whole.

Tokenisation follows lm-evaluation-harness for causal models, so the numbers agree with it: no special tokens
are added, and a (context, continuation) pair is encoded as a whole and split where the context's tokens end,
with whitespace that ends the context moved to the continuation. What is faster than lm-eval: windows of similar
length are batched, only the logits of scored positions are computed (`logits_to_keep`), and one fused
cross-entropy scores a whole batch.

Shape legend: B windows in a batch, T padded window length, K kept logit positions, V vocabulary.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from .data import EvaluationError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# Config fields that hold a model's context window, in the order lm-evaluation-harness reads them.
_WINDOW_FIELDS = ("n_positions", "max_position_embeddings", "n_ctx")
_UNSET_TOKENIZER_LENGTH = 10**9


@dataclass(frozen=True)
class Window:
    """One forward pass: `tokens[:-1]` go in, and the last `num_scored` of `tokens` are the scored targets."""

    tokens: tuple[int, ...]
    num_scored: int


@dataclass(frozen=True)
class Score:
    """The score of a window, a text or a continuation.

    Attributes:
        loglikelihood: Sum of the log-probabilities of the scored tokens (nats).
        num_tokens: Number of scored tokens.
        is_greedy: Every scored token is the arg-max prediction (greedy decoding produces them); False when the
            check was not asked for (rolling scores).
        truncated: The context was cut from the left to fit the window.
    """

    loglikelihood: float
    num_tokens: int
    is_greedy: bool = False
    truncated: bool = False


def _window(context: Sequence[int], continuation: Sequence[int], max_length: int) -> Window:
    """The forward pass that scores `continuation` after `context`, as lm-eval's `_loglikelihood_tokens` builds it:
    the last `max_length + 1` tokens of both."""
    return Window(tuple((list(context) + list(continuation))[-(max_length + 1) :]), len(continuation))


def rolling_windows(tokens: Sequence[int], prefix_token_id: int | None, max_length: int, stride: int) -> list[Window]:
    """The windows that score every token of `tokens` exactly once: lm-evaluation-harness's rolling windows.

    Args:
        tokens: The token ids of one text.
        prefix_token_id: Token placed before the text so its first token is scored; `None` leaves the first
            token unscored (it is the context of the second).
        max_length: Longest model input (the context window).
        stride: New tokens scored per window after the first, 1 <= stride <= max_length.
    """
    if not 1 <= stride <= max_length:
        raise EvaluationError(f"`stride` must be in [1, max_length={max_length}], got {stride}.")
    try:
        from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
    except ImportError:
        raise EvaluationError(
            "rolling log-likelihoods use lm-evaluation-harness's windows: pip install 'aot-transformers[eval]'."
        ) from None
    tokens = list(tokens)
    if prefix_token_id is None:  # the first token only conditions the others
        prefix_token_id, tokens = (tokens[0], tokens[1:]) if tokens else (None, [])
    pairs = get_rolling_token_windows(tokens, prefix_token_id, max_length, max_length - stride + 1)
    return [_window(context, continuation, max_length) for context, continuation in map(make_disjoint_window, pairs)]


def model_context_window(model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase | None = None) -> int | None:
    """The longest input `model` accepts, from its config (or the tokenizer's `model_max_length`); None if unknown."""
    config = getattr(model, "config", None)
    for field in _WINDOW_FIELDS:
        value = getattr(config, field, None)
        if isinstance(value, int) and value > 0:
            return value
    length = getattr(tokenizer, "model_max_length", None)
    return length if isinstance(length, int) and 0 < length < _UNSET_TOKENIZER_LENGTH else None


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
        progress: Show a progress bar.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: PreTrainedTokenizerBase,
        max_length: int | None = None,
        stride: int | None = None,
        batch_size: int = 8,
        bf16: bool = False,
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
        # Placed before each text for rolling scores: BOS, else EOS, else none (see the module docstring).
        prefix_token_id = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
        self.model, self.tokenizer, self.max_length, self.stride = model, tokenizer, max_length, stride
        self.batch_size, self.bf16, self.prefix_token_id, self.progress = batch_size, bf16, prefix_token_id, progress
        head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        size = getattr(head, "out_features", None) or getattr(getattr(model, "config", None), "vocab_size", None)
        self.vocab_size = int(size) if size else None
        self._takes_logits_to_keep = "logits_to_keep" in inspect.signature(model.forward).parameters
        self._device = next(model.parameters()).device

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
        whole, context_ids = self.encode(context + continuation), self.encode(context)
        return whole[: len(context_ids)], whole[len(context_ids) :]

    def rolling_loglikelihoods(self, texts: Sequence[str], description: str = "rolling") -> list[Score]:
        """Log-likelihood of every token of each text (lm-eval's rolling windows; see the module docstring)."""
        per_text = [rolling_windows(self.encode(t), self.prefix_token_id, self.max_length, self.stride) for t in texts]
        scores = iter(self.score_windows([w for windows in per_text for w in windows], description, greedy=False))
        totals = [[next(scores) for _ in windows] for windows in per_text]
        return [
            Score(sum((s.loglikelihood for s in parts), 0.0), sum(s.num_tokens for s in parts)) for parts in totals
        ]

    def conditional_loglikelihoods(
        self, pairs: Sequence[tuple[str, str]], description: str = "loglikelihood"
    ) -> list[Score]:
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
            truncated.append(len(context_ids) + len(continuation_ids) > self.max_length + 1)
            windows.append(_window(context_ids, continuation_ids, self.max_length))
        scores = self.score_windows(windows, description)
        return [replace(score, truncated=cut) for score, cut in zip(scores, truncated, strict=True)]

    @torch.no_grad()
    def score_windows(
        self, windows: Sequence[Window], description: str = "scoring", greedy: bool = True
    ) -> list[Score]:
        """Score `windows` in batches of similar length (longest first, so a memory error shows at once), under a
        progress bar labelled `description`. With `greedy`, also check whether each target is the arg-max (an extra
        pass over the logits; the rolling scores do not need it and report `is_greedy=False`)."""
        order = sorted(range(len(windows)), key=lambda i: -len(windows[i].tokens))
        results: list[Score] = [None] * len(windows)  # type: ignore[list-item]
        disable = not self.progress or not windows
        with tqdm(total=len(windows), desc=description, unit="window", leave=False, disable=disable) as bar:
            for start in range(0, len(order), self.batch_size):
                indices = order[start : start + self.batch_size]
                for index, score in zip(
                    indices, self._score_batch([windows[i] for i in indices], greedy), strict=True
                ):
                    results[index] = score
                bar.update(len(indices))
        return results

    def _score_batch(self, batch: Sequence[Window], greedy: bool) -> list[Score]:
        padded = max(len(window.tokens) for window in batch) - 1
        # Right padding: a causal model never lets a real position see the padding after it.
        tokens = torch.tensor([list(w.tokens) + [0] * (padded + 1 - len(w.tokens)) for w in batch])  # (B, T + 1)
        ends = torch.tensor([len(w.tokens) - 1 for w in batch])[:, None]  # (B, 1) input lengths
        starts = ends - torch.tensor([w.num_scored for w in batch])[:, None]  # (B, 1) first scored input position
        positions = torch.arange(padded)
        scored = (positions >= starts) & (positions < ends)  # (B, T): the positions that predict a target
        # Only the positions that predict a target need logits (a few per row for the last-word and cloze tasks).
        keep = int((padded - starts).max())
        kwargs = {"logits_to_keep": keep} if self._takes_logits_to_keep else {}
        with torch.autocast(self._device.type, dtype=torch.bfloat16) if self.bf16 else nullcontext():
            logits = self.model(input_ids=tokens[:, :-1].to(self._device), use_cache=False, **kwargs).logits
        logits = logits[:, -keep:]  # (B, K, V)
        targets, scored = tokens[:, 1:][:, -keep:].to(logits.device), scored[:, -keep:].to(logits.device)
        logprobs, hits = _target_logprobs(logits, targets, greedy)  # (B, K), (B, K) or None
        totals = logprobs.double().masked_fill(~scored, 0.0).sum(dim=1)  # (B,)
        greedy_rows = (hits | ~scored).all(dim=1).tolist() if greedy else [False] * len(batch)  # (B,)
        return [Score(float(t), w.num_scored, bool(g)) for t, w, g in zip(totals, batch, greedy_rows, strict=True)]


def _target_logprobs(
    logits: torch.Tensor, targets: torch.Tensor, greedy: bool, chunk: int = 4096
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log p(target) (B, K) in float32 and, when asked, whether the target is the arg-max (else None).

    One fused cross-entropy over all kept positions is much faster than one call per row; it runs over chunks of
    positions so the temporary log-softmax stays O(chunk · V).
    """
    flat, flat_targets = logits.flatten(0, 1), targets.flatten()  # (B·K, V), (B·K,)
    logprobs, hits = [], []
    for start in range(0, flat.shape[0], chunk):
        part, target = flat[start : start + chunk].float(), flat_targets[start : start + chunk]  # (n, V), (n,)
        logprobs.append(-F.cross_entropy(part, target, reduction="none"))
        if greedy:
            hits.append(part.argmax(dim=-1) == target)
    return torch.cat(logprobs).view_as(targets), torch.cat(hits).view_as(targets) if greedy else None
