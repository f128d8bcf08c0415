"""Byte-level BPE tokenizers trained with `tokenizers`, wrapped as `transformers` fast tokenizers."""

from __future__ import annotations

import os
from collections.abc import Iterable

END_OF_TEXT = "<|endoftext|>"


def load_tokenizer(name_or_path: str | os.PathLike, **kwargs):
    """`AutoTokenizer.from_pretrained(name_or_path, trust_remote_code=False)`: never the remote-code prompt.

    `AutoTokenizer` reads the folder's `config.json`, whose `auto_map` (the model is remote code) would make
    transformers ask on the terminal unless `trust_remote_code` is explicit. This package registers `aot`, so its own
    folders need no remote code for the tokenizer; one that does fails with a clear error instead of asking.
    """
    from pathlib import Path

    from transformers import AutoTokenizer, GPT2TokenizerFast

    from .. import configuration_aot  # noqa: F401 - the `aot` model type is registered on package import

    folder = Path(name_or_path)
    if (
        folder.is_dir()
        and not any((folder / name).is_file() for name in ("tokenizer_config.json", "tokenizer.json"))
        and all((folder / name).is_file() for name in ("vocab.json", "merges.txt"))
    ):  # the GPT-2 tokenizer as OpenAI published it (vocabulary and merges only), e.g. ../shared/data/tokenizer-gpt2
        return GPT2TokenizerFast.from_pretrained(folder, **kwargs)
    return AutoTokenizer.from_pretrained(os.fspath(name_or_path), trust_remote_code=False, **kwargs)


def train_bpe_tokenizer(
    texts: Iterable[str],
    vocab_size: int,
    min_frequency: int = 2,
    show_progress: bool = True,
    length: int | None = None,
):
    """Train a GPT-2-style byte-level BPE tokenizer on `texts` (an iterable of strings, consumed once; `length`, if
    known, for the progress bar). Deterministic for a given input.

    Every byte is in the initial alphabet, so any text encodes without unknown tokens; `<|endoftext|>` (id 0) is
    the BOS, EOS and padding token. `vocab_size` counts it and must be at least 257 (256 bytes + `<|endoftext|>`);
    pairs seen fewer than `min_frequency` times are not merged. Returns a `transformers.PreTrainedTokenizerFast`
    with exactly `vocab_size` tokens (fewer if the text is too short to learn that many merges).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    if vocab_size < 257:
        raise ValueError(
            f"`vocab_size` of a byte-level BPE must be >= 257 (256 bytes + {END_OF_TEXT}), got {vocab_size}."
        )
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=[END_OF_TEXT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=show_progress,
    )
    tokenizer.train_from_iterator((text for text in texts if text), trainer=trainer, length=length)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=END_OF_TEXT,
        eos_token=END_OF_TEXT,
        pad_token=END_OF_TEXT,
        unk_token=END_OF_TEXT,
        model_max_length=1_000_000,
    )
