"""The tests' helpers (`from support import ...`; `tests/` is on pytest's `pythonpath`): tiny configs, the location
of the shared data, and for the evaluation tests a character tokenizer, a model whose logits we set and tiny saved
models. Fixtures live in conftest.py."""

from __future__ import annotations

import math
import os
import re
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, models, pre_tokenizers
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel, PreTrainedTokenizerFast
from transformers.modeling_outputs import CausalLMOutput

from aot_transformers import AoTConfig, AoTForCausalLM

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("AOT_SHARED_DATA", REPO_ROOT.parent / "shared" / "data"))
FIXTURES = REPO_ROOT / "tests" / "fixtures" / "eval"  # the evaluation tests' small task files


# What a complete results file records (`aot_transformers._io.provenance`): these versions and host fields.
VERSIONS = ("python", "torch", "transformers", "accelerate", "datasets")
HOST = ("cpu", "threads", "platform")


def provenance_problems(record: dict) -> list[str]:
    """What a results file's record lacks of its provenance (empty when complete): a command, a git revision that is
    a commit and, unless its `provenance_note` says what it does not record, every version and the host."""
    problems = [f"no {key}" for key in ("command", "git_revision") if not record.get(key)]
    if record.get("git_revision") and not re.fullmatch(r"[0-9a-f]{40}(\+dirty)?", record["git_revision"]):
        problems.append(f"git_revision {record['git_revision']!r} is not a commit")
    if "provenance_note" not in record:  # a complete record: every library and the host
        problems += [f"no versions.{name}" for name in VERSIONS if name not in record.get("versions", {})]
        problems += [f"no host.{name}" for name in HOST if name not in record.get("host", {})]
    return problems


def tiny_config(**overrides) -> AoTConfig:
    """A small text config (fast on CPU); any field can be overridden."""
    fields = dict(
        vocab_size=97,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=64,
        image_size=16,
        patch_size=4,
        num_channels=3,
        num_labels=5,
    )
    fields.update(overrides)
    return AoTConfig(**fields)


# Evaluation helpers.

EOS = "<|endoftext|>"


def char_tokenizer() -> PreTrainedTokenizerFast:
    """One token per character (printable ASCII and newline), id 0 = EOS (used as the document prefix), no BOS."""
    chars = [chr(i) for i in range(32, 127)] + ["\n"]
    vocab = {EOS: 0, "<unk>": 1, **{c: i + 2 for i, c in enumerate(chars)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=EOS, unk_token="<unk>")


class PreferenceConfig(PretrainedConfig):
    model_type = "eval_test_preference"

    def __init__(self, vocab_size: int = 98, max_position_embeddings: int = 32, strength: float = 10.0, **kwargs):
        self.vocab_size = vocab_size
        self.max_position_embeddings = max_position_embeddings
        self.strength = strength
        super().__init__(**kwargs)


class PreferenceLM(PreTrainedModel):
    """A bigram model whose logits we set: after token a, logit `strength` for `preferred[a]` and 0 elsewhere.

    So log p(b | ..., a) = strength·[b == preferred[a]] − log(e^strength + V − 1), and the greedy next token after a
    is `preferred[a]`: every number the tasks report can be written down by hand.
    """

    config_class = PreferenceConfig
    main_input_name = "input_ids"

    def __init__(self, config: PreferenceConfig):
        super().__init__(config)
        self.register_buffer("preferred", torch.zeros(config.vocab_size, dtype=torch.long))
        self.anchor = nn.Parameter(torch.zeros(1))  # gives the model a device and a dtype
        self.post_init()

    def prefer(self, pairs: dict[int, int]) -> PreferenceLM:
        for a, b in pairs.items():
            self.preferred[a] = b
        return self

    def logprob(self, hit: bool) -> float:
        """The log-probability of a token that is (or is not) the preferred one, by hand."""
        s, v = self.config.strength, self.config.vocab_size
        return (s if hit else 0.0) - math.log(math.exp(s) + v - 1)

    def forward(self, input_ids=None, attention_mask=None, logits_to_keep: int = 0, **kwargs):
        if input_ids.shape[1] > self.config.max_position_embeddings:
            raise IndexError(f"input of {input_ids.shape[1]} tokens > {self.config.max_position_embeddings}")
        logits = torch.zeros(*input_ids.shape, self.config.vocab_size) + self.anchor
        logits.scatter_(-1, self.preferred[input_ids].unsqueeze(-1), self.config.strength)
        return CausalLMOutput(logits=logits[:, -logits_to_keep:] if logits_to_keep else logits)


def preference_lm(vocab_size: int = 98, max_length: int = 32, pairs: dict[int, int] | None = None) -> PreferenceLM:
    """A `PreferenceLM`; token pairs not listed prefer token 1 (`<unk>`, which never occurs in the texts)."""
    model = PreferenceLM(PreferenceConfig(vocab_size=vocab_size, max_position_embeddings=max_length)).eval()
    model.preferred.fill_(1)
    return model.prefer(pairs or {})


def tiny_aot(vocab_size: int = 98, max_length: int = 16, seed: int = 0, **overrides) -> AoTForCausalLM:
    """A randomly initialised tiny AoT language model (its logits depend on the whole context)."""
    torch.manual_seed(seed)
    fields = dict(
        vocab_size=vocab_size,
        max_position_embeddings=max_length,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        initializer_range=0.2,
    )
    fields.update(overrides)
    config = AoTConfig.from_preset("aot-mssa-l-tiny", **fields)
    return AoTForCausalLM(config).eval()


def save_model(model: PreTrainedModel, tokenizer, folder: Path) -> Path:
    """Save a model (and the tokenizer when given) the way users do."""
    model.save_pretrained(folder)
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)
    return folder


def token_logprobs(model: nn.Module, inputs: list[int]) -> torch.Tensor:
    """log p(next | prefix) at every position of one un-batched forward pass: (T, V)."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([inputs])).logits[0]
    return torch.log_softmax(logits.double(), dim=-1)
