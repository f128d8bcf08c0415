"""Greedy generation: AoT vs GPT-2 decoding speed, cache vs no cache, static cache + torch.compile vs the dynamic
cache, and MSSA vs MHSA cache memory.

    python -m benchmarks.bench_generate        # about 15 minutes on 2 cores (compilation included)

Greedy, fp32, d=512, 8 heads, 6 layers, vocab 1024 (same width and depth for AoT and GPT-2); batch 1 unless a row
says otherwise. The static-cache rows use `generate(cache_implementation="static", compile_config=...)`, the path a
user takes: transformers compiles the decoding step (`fullgraph=True`) once per batch size; the first call, which
compiles, is a warm-up and is not timed.
"""

from __future__ import annotations

import argparse
import json

import torch
from transformers import AutoModelForCausalLM, CompileConfig, GPT2LMHeadModel

from aot_transformers import AoTConfig, AoTForCausalLM

from ._common import RESULTS_DIR, interleaved_best_times, setup, updating_command, write_results
from .peers import peer_model

WIDTH, HEADS, LAYERS, VOCAB = 512, 8, 6, 1024


def gpt2() -> GPT2LMHeadModel:
    return peer_model(
        AutoModelForCausalLM,
        "gpt2",
        vocab_size=VOCAB,
        hidden_size=WIDTH,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        max_position_embeddings=1024,
        pad_token_id=0,
    ).eval()


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


def compile_config() -> CompileConfig:
    """Compile the decoding step on any device (transformers compiles automatically only on accelerators)."""
    config = CompileConfig(fullgraph=True, dynamic=False, mode="default")
    config._compile_all_devices = True
    return config


def generator(model, new_tokens: int, use_cache: bool = True, batch: int = 1, static: bool = False):
    prompt = torch.randint(1, VOCAB, (batch, 16))
    extra = dict(cache_implementation="static", compile_config=compile_config()) if static else {}

    def run():
        with torch.no_grad():
            out = model.generate(
                prompt,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                do_sample=False,
                use_cache=use_cache,
                **extra,
            )
        assert out.shape == (batch, 16 + new_tokens)

    return run


def cache_bytes(model, length: int = 512) -> int:
    with torch.no_grad():
        cache = model(torch.randint(1, VOCAB, (1, length)), use_cache=True).cache
    return sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))


SECTIONS = ("speed", "cache", "static")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--sections",
        nargs="+",
        choices=SECTIONS,
        default=list(SECTIONS),
        help="rerun only these sections; the others keep their values in results/generate.json",
    )
    args = parser.parse_args(argv)
    setup()
    models = {"gpt2": gpt2(), "aot-mssa": aot("mssa"), "aot-mhsa": aot("mhsa")}
    new_tokens = 256
    results, command = {}, None
    if set(args.sections) != set(SECTIONS) and (RESULTS_DIR / "generate.json").exists():
        results = json.loads((RESULTS_DIR / "generate.json").read_text())
        results.pop("machine", None)
        command = updating_command(results)  # the other sections come from the earlier run
    if "speed" in args.sections:
        times = interleaved_best_times(
            {name: generator(m, new_tokens) for name, m in models.items()}, rounds=args.rounds, warmup=1
        )
        speed = {name: new_tokens / t for name, t in times.items()}
        results["cached_tokens_per_s_256_new"] = speed
        results["aot_mssa_vs_gpt2_cached"] = speed["aot-mssa"] / speed["gpt2"]
        results["aot_mhsa_vs_gpt2_cached"] = speed["aot-mhsa"] / speed["gpt2"]
        print(results, flush=True)
    if "cache" in args.sections:
        long = 512
        times = interleaved_best_times(
            {
                "cached": generator(models["aot-mssa"], long, use_cache=True),
                "uncached": generator(models["aot-mssa"], long, use_cache=False),
            },
            rounds=2,
            warmup=0,
        )
        results["aot_mssa_512_new_seconds"] = times
        results["cache_speedup_512_new"] = times["uncached"] / times["cached"]
        sizes = {name: cache_bytes(m) for name, m in models.items()}
        results["cache_bytes_512_tokens"] = sizes
        results["cache_ratio_mssa_vs_mhsa"] = sizes["aot-mssa"] / sizes["aot-mhsa"]
        print(results, flush=True)
    if "static" in args.sections:
        results["static_compiled"] = static_cache_rows(models, new_tokens, args.rounds)
        print(results["static_compiled"], flush=True)
    write_results("generate", results, command)
    return results


def static_cache_rows(models: dict, new_tokens: int, rounds: int) -> dict:
    """Tokens/s of greedy decoding with the dynamic cache (eager) and with the static cache + torch.compile, for
    AoT-MSSA and GPT-2, at batch 1 and 8, all interleaved in one run; and the two ratios the issue asks for."""
    rows = {}
    for batch in (1, 8):
        fns = {
            f"{name}-{cache}": generator(models[name], new_tokens, batch=batch, static=cache == "static")
            for name in ("aot-mssa", "gpt2")
            for cache in ("dynamic", "static")
        }
        times = interleaved_best_times(fns, rounds=rounds, warmup=1)
        speed = {name: batch * new_tokens / t for name, t in times.items()}
        rows[f"batch_{batch}"] = {
            "tokens_per_s": speed,
            "aot_static_compiled_vs_dynamic": speed["aot-mssa-static"] / speed["aot-mssa-dynamic"],
            "aot_vs_gpt2_static_compiled": speed["aot-mssa-static"] / speed["gpt2-static"],
            "gpt2_static_compiled_vs_dynamic": speed["gpt2-static"] / speed["gpt2-dynamic"],
        }
    return rows


if __name__ == "__main__":
    main()
