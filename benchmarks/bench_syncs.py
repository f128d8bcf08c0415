"""Host syncs per step (reads of tensor values into Python, which stall an accelerator): AoT vs GPT-2 and Llama.

    python -m benchmarks.bench_syncs        # a few seconds

Counts with `benchmarks.syncs.count_host_syncs` (a `TorchDispatchMode`; device-independent, so a CPU run counts
what a GPU run would sync on). Tiny models built from configs (4 layers, hidden 64, 4 heads, vocab 1000; Llama with
2 key/value heads); the k-NN models score queries in chunks of 8 (`knn_chunk_size=8`), so a 32-token forward runs 4
chunks per layer and a per-chunk sync shows. Steps:

- `forward`: eval forward of a (2, 32) batch, `use_cache=False`;
- `forward_mask`: the same with a 2-D all-ones `attention_mask`;
- `train`: `model.train()`, forward with labels, `loss.backward()`;
- `decode`: one (1, 1) token on a `DynamicCache` that holds 16 tokens (the prefill is not counted);
- `generate`: greedy `generate` of 16 new tokens from an (1, 8) prompt with its all-ones `attention_mask`.

Each step runs once uncounted first (lazy initialisation) and then once counted. Writes results/syncs.json:
counts per model and step, the per-op breakdown and the sites (`file:line (function)`, innermost frame outside
torch) of every sync.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch
from transformers import AutoModelForCausalLM, DynamicCache, GPT2LMHeadModel, LlamaForCausalLM

import aot_transformers.knn  # noqa: F401  (registers the "knn" backend for any model)
from aot_transformers import AoTConfig, AoTForCausalLM

from ._common import invocation, setup, write_results
from .peers import peer_model
from .syncs import count_host_syncs

VOCAB, WIDTH, LAYERS, HEADS, POSITIONS = 1000, 64, 4, 4, 256
BATCH, LENGTH = 2, 32
CACHED, PROMPT, NEW_TOKENS = 16, 8, 16
KNN_CHUNK = 8


def aot(preset: str = "aot-mssa-l-tiny", **overrides) -> AoTForCausalLM:
    config = AoTConfig.from_preset(
        preset,
        **{
            "num_hidden_layers": LAYERS,
            "hidden_size": WIDTH,
            "num_attention_heads": HEADS,
            "vocab_size": VOCAB,
            "max_position_embeddings": POSITIONS,
            "pad_token_id": 0,
            **overrides,
        },
    )
    return AoTForCausalLM(config).eval()


# The peers' sizes and special tokens (no BOS / EOS: generation never stops early).
PEER_FIELDS = dict(
    vocab_size=VOCAB,
    hidden_size=WIDTH,
    num_hidden_layers=LAYERS,
    num_attention_heads=HEADS,
    max_position_embeddings=POSITIONS,
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=0,
)


def gpt2() -> GPT2LMHeadModel:
    # transformers' default dropout, as counted: the train step runs it.
    dropout = dict(resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1)
    return peer_model(AutoModelForCausalLM, "gpt2", **PEER_FIELDS, **dropout).eval()


def llama(attn_implementation: str = "sdpa", **extra) -> LlamaForCausalLM:
    """Llama with grouped-query attention (2 key/value heads); `extra` (e.g. `knn_k`, read by the "knn" backend)
    goes into its config."""
    model = peer_model(
        AutoModelForCausalLM,
        "llama",
        attn_implementation,
        **PEER_FIELDS,
        intermediate_size=4 * WIDTH,
        num_key_value_heads=2,
        **extra,
    )
    return model.eval()


MODELS: dict[str, Callable[[], torch.nn.Module]] = {
    "aot-mssa": lambda: aot("aot-mssa-l-tiny"),
    "aot-mhsa": lambda: aot("aot-mhsa-l-tiny"),
    "aot-mssa-knn8": lambda: aot("aot-mssa-l-tiny", knn_k=8, knn_chunk_size=KNN_CHUNK),
    "aot-mssa-knn0.5": lambda: aot("aot-mssa-l-tiny", knn_k=0.5, knn_chunk_size=KNN_CHUNK),
    "gpt2": gpt2,
    "llama": llama,
    "llama-knn8": lambda: llama("knn", knn_k=8, knn_chunk_size=KNN_CHUNK),
}


def _tokens(*shape: int) -> torch.Tensor:
    return torch.randint(1, VOCAB, shape)


def forward_step(model, length: int = LENGTH, mask: bool = False) -> Callable[[], object]:
    input_ids = _tokens(BATCH, length)
    extra = {"attention_mask": torch.ones_like(input_ids)} if mask else {}

    def run():
        model.eval()
        with torch.no_grad():
            return model(input_ids, use_cache=False, **extra)

    return run


def train_step(model, length: int = LENGTH) -> Callable[[], object]:
    input_ids = _tokens(BATCH, length)

    def run():
        model.train()
        loss = model(input_ids, labels=input_ids).loss
        loss.backward()
        model.eval()

    return run


def decode_step(model) -> Callable[[], object]:
    """The counted call is the one new token; the 16-token prefill happens before, outside `run`."""
    prompt, token = _tokens(1, CACHED), _tokens(1, 1)
    state = {}

    def prefill():
        with torch.no_grad():
            cache = DynamicCache(config=model.config)
            model(prompt, cache=cache, use_cache=True)
            assert cache.get_seq_length() == CACHED
        state["cache"] = cache

    def run():
        with torch.no_grad():
            return model(token, cache=state["cache"], use_cache=True)

    run.prepare = prefill
    return run


def generate_step(model) -> Callable[[], object]:
    prompt = _tokens(1, PROMPT)

    def run():
        out = model.generate(
            prompt,
            attention_mask=torch.ones_like(prompt),
            do_sample=False,
            max_new_tokens=NEW_TOKENS,
            min_new_tokens=NEW_TOKENS,
            pad_token_id=0,
            eos_token_id=None,
        )
        assert out.shape == (1, PROMPT + NEW_TOKENS)

    return run


STEPS: dict[str, Callable[..., Callable[[], object]]] = {
    "forward": forward_step,
    "forward_mask": lambda model: forward_step(model, mask=True),
    "train": train_step,
    "decode": decode_step,
    "generate": generate_step,
}


def count_step(run: Callable[[], object], warmup: bool = True, stack_depth: int = 1):
    """The `SyncCounter` of one call of `run` (after an uncounted warm-up call); `run.prepare`, if any, runs
    uncounted before each call."""
    prepare = getattr(run, "prepare", lambda: None)
    if warmup:
        prepare()
        run()
    prepare()
    with count_host_syncs(stack_depth=stack_depth) as syncs:
        run()
    return syncs


def table(counts: dict[str, dict[str, int]], steps: list[str]) -> str:
    lines = ["| model | " + " | ".join(steps) + " |", "|---" * (len(steps) + 1) + "|"]
    for name, row in counts.items():
        lines.append(f"| {name} | " + " | ".join(str(row[step]) for step in steps) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    parser.add_argument("--steps", nargs="+", choices=list(STEPS), default=list(STEPS))
    parser.add_argument("--stack-depth", type=int, default=2, help="frames outside torch recorded per sync site")
    parser.add_argument("--no-write", action="store_true", help="print only; leave results/syncs.json alone")
    args = parser.parse_args(argv)
    setup()
    counts, by_op, sites = {}, {}, {}
    for name in args.models:
        torch.manual_seed(0)
        model = MODELS[name]()
        counts[name], by_op[name], sites[name] = {}, {}, {}
        for step in args.steps:
            syncs = count_step(STEPS[step](model), stack_depth=args.stack_depth)
            counts[name][step] = syncs.count
            by_op[name][step] = dict(syncs.by_op.most_common())
            sites[name][step] = dict(syncs.by_site.most_common())
    results = {
        "syncs": counts,
        "by_op": by_op,
        "sites": sites,
    }
    print(table(counts, args.steps))
    if not args.no_write:
        print(f"wrote {write_results('syncs', results, invocation('benchmarks.bench_syncs', argv))}")
    return results


if __name__ == "__main__":
    main()
