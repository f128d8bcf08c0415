"""Greedy generation: AoT vs GPT-2 decoding speed, cache vs no cache, and MSSA vs MHSA cache memory.

    python -m benchmarks.bench_generate        # about 5 minutes on 2 cores

Batch 1, greedy, fp32, d=512, 8 heads, 6 layers, vocab 1024 (same width and depth for AoT and GPT-2).
"""

from __future__ import annotations

import argparse

import torch
from transformers import GPT2Config, GPT2LMHeadModel

from aot_transformers import AoTConfig, AoTForCausalLM

from ._common import interleaved_best_times, setup, write_results

WIDTH, HEADS, LAYERS, VOCAB = 512, 8, 6, 1024


def gpt2() -> GPT2LMHeadModel:
    config = GPT2Config(
        vocab_size=VOCAB,
        n_embd=WIDTH,
        n_layer=LAYERS,
        n_head=HEADS,
        n_positions=1024,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=0,
    )
    config._attn_implementation = "sdpa"
    return GPT2LMHeadModel(config).eval()


def aot(attention_type: str = "mssa") -> AoTForCausalLM:
    config = AoTConfig(
        vocab_size=VOCAB,
        hidden_size=WIDTH,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        max_position_embeddings=1024,
        attention_type=attention_type,
        pad_token_id=0,
        normalize_query=attention_type == "mssa",
    )
    return AoTForCausalLM(config).eval()


def generator(model, new_tokens: int, use_cache: bool = True):
    prompt = torch.randint(1, VOCAB, (1, 16))

    def run():
        with torch.no_grad():
            out = model.generate(
                prompt, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, use_cache=use_cache
            )
        assert out.shape[1] == 16 + new_tokens

    return run


def cache_bytes(model, length: int = 512) -> int:
    with torch.no_grad():
        cache = model(torch.randint(1, VOCAB, (1, length)), use_cache=True).past_key_values
    return sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    setup()
    models = {"gpt2": gpt2(), "aot-mssa": aot("mssa"), "aot-mhsa": aot("mhsa")}
    new_tokens = 256
    times = interleaved_best_times(
        {name: generator(m, new_tokens) for name, m in models.items()}, rounds=args.rounds, warmup=1
    )
    speed = {name: new_tokens / t for name, t in times.items()}
    results = {
        "cached_tokens_per_s_256_new": speed,
        "aot_mssa_vs_gpt2_cached": speed["aot-mssa"] / speed["gpt2"],
        "aot_mhsa_vs_gpt2_cached": speed["aot-mhsa"] / speed["gpt2"],
    }
    print(results, flush=True)
    long = 512
    times = interleaved_best_times(
        {
            "cached": generator(models["aot-mssa"], long, use_cache=True),
            "uncached": generator(models["aot-mssa"], long, use_cache=False),
        },
        rounds=1,
        warmup=0,
    )
    results["aot_mssa_512_new_seconds"] = times
    results["cache_speedup_512_new"] = times["uncached"] / times["cached"]
    sizes = {name: cache_bytes(m) for name, m in models.items()}
    results["cache_bytes_512_tokens"] = sizes
    results["cache_ratio_mssa_vs_mhsa"] = sizes["aot-mssa"] / sizes["aot-mhsa"]
    print(results, flush=True)
    write_results("generate", results)
    return results


if __name__ == "__main__":
    main()
