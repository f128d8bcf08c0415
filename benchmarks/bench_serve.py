"""Serving throughput: `aot serve` (transformers' server, sequential and `--continuous-batching`) against
`generate` on the same model in one process.

    python -m benchmarks.bench_serve           # about 5 minutes on 2 cores

An AoT MSSA model (d=512, 8 heads, 6 layers, 1,024 positions) with the GPT-2 tokenizer (../shared/data), greedy,
fp32, eos disabled so every completion is `--new` tokens long. The same prompts (`--requests` lines of
tinyshakespeare) go to: `generate` one prompt at a time, `generate` on the whole batch (left padding), and the
server over loopback with the `openai` client, `--concurrency` requests in flight. Each mode is timed over all
requests after a warm-up; the best of `--rounds` rounds is kept. The server runs in its own process with 2 torch
threads, as `generate` runs here.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from transformers import GPT2TokenizerFast

from aot_transformers import AoTConfig, AoTForCausalLM

from ._common import setup, write_results

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
WIDTH, HEADS, LAYERS = 512, 8, 6


def save_model(folder: Path, tokenizer_dir: Path) -> None:
    tokenizer = GPT2TokenizerFast.from_pretrained(tokenizer_dir)
    tokenizer.pad_token = tokenizer.eos_token
    config = AoTConfig.from_preset(
        "aot-mssa-l-tiny",
        vocab_size=len(tokenizer),
        hidden_size=WIDTH,
        num_attention_heads=HEADS,
        num_hidden_layers=LAYERS,
        max_position_embeddings=1024,
        pad_token_id=tokenizer.eos_token_id,
        eos_token_id=None,
        bos_token_id=None,
    )
    AoTForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def prompts(count: int, corpus: Path) -> list[str]:
    lines = [line.strip() for line in corpus.read_text().splitlines() if len(line.strip()) > 20]
    return lines[:count]


def time_rounds(run, rounds: int) -> float:
    run()  # warm-up
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


def generate_modes(folder: Path, texts: list[str], new: int, rounds: int) -> dict:
    model = AoTForCausalLM.from_pretrained(folder).eval()
    tokenizer = GPT2TokenizerFast.from_pretrained(folder)
    tokenizer.padding_side = "left"
    singles = [tokenizer(text, return_tensors="pt") for text in texts]
    batch = tokenizer(texts, return_tensors="pt", padding=True)
    options = dict(max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=tokenizer.pad_token_id)

    def one_at_a_time():
        with torch.no_grad():
            for inputs in singles:
                model.generate(**inputs, **options)

    def batched():
        with torch.no_grad():
            model.generate(**batch, **options)

    return {
        "generate, one prompt at a time": time_rounds(one_at_a_time, rounds),
        "generate, one padded batch": time_rounds(batched, rounds),
    }


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def serve_mode(folder: Path, texts: list[str], new: int, rounds: int, concurrency: int, options: list[str]) -> float:
    import openai

    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    env["OMP_NUM_THREADS"] = "2"
    command = [sys.executable, "-m", "aot_transformers.cli", "serve", str(folder), "--host", "127.0.0.1"]
    log = open(folder.parent / f"serve-{port}.log", "w")  # closed with the process below
    process = subprocess.Popen(
        [*command, "--port", str(port), *options], stdout=log, stderr=subprocess.STDOUT, env=env
    )
    try:
        deadline = time.monotonic() + 300
        while True:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"server did not start: {Path(log.name).read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                    break
            except OSError:
                time.sleep(0.5)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=600)

        def ask(text):
            answer = client.completions.create(model=str(folder), prompt=text, max_tokens=new, temperature=0)
            assert answer.usage.completion_tokens == new, answer.usage

        def run():
            with ThreadPoolExecutor(concurrency) as pool:
                list(pool.map(ask, texts))

        return time_rounds(run, rounds)
    finally:
        process.terminate()
        process.wait(timeout=30)
        log.close()


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--new", type=int, default=32, help="tokens generated per completion")
    parser.add_argument("--concurrency", type=int, default=8, help="requests in flight against the server")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--shared-data", type=Path, default=SHARED)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    setup(threads=2)
    texts = prompts(args.requests, args.shared_data / "text" / "tinyshakespeare" / "input.txt")
    cb = ["--continuous-batching", "--cb-num-blocks", "128", "--cb-block-size", "32"]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "aot-mssa-512"
        save_model(folder, args.shared_data / "tokenizer-gpt2")
        seconds = generate_modes(folder, texts, args.new, args.rounds)
        seconds["aot serve"] = serve_mode(folder, texts, args.new, args.rounds, args.concurrency, [])
        seconds["aot serve --continuous-batching"] = serve_mode(
            folder, texts, args.new, args.rounds, args.concurrency, cb
        )
    load = os.getloadavg()[:2]  # a shared machine slows every mode; the ratios between modes are the result
    tokens = args.requests * args.new
    rows = {
        mode: {
            "seconds": round(s, 3),
            "completions_per_s": round(args.requests / s, 2),
            "tokens_per_s": round(tokens / s, 1),
        }
        for mode, s in seconds.items()
    }
    results = {
        "model": f"AoT MSSA d={WIDTH}, {HEADS} heads, {LAYERS} layers, GPT-2 vocabulary (50,257), fp32",
        "workload": {
            "requests": args.requests,
            "new_tokens_each": args.new,
            "concurrency": args.concurrency,
            "prompts": "first lines of tinyshakespeare longer than 20 characters",
            "continuous_batching_options": cb[1:],
        },
        "modes": rows,
        "load_average_1_5_min_after": [round(x, 2) for x in load],
    }
    for mode, row in rows.items():
        print(
            f"{mode:36s} {row['seconds']:8.2f} s {row['completions_per_s']:7.2f} completions/s "
            f"{row['tokens_per_s']:8.1f} tokens/s"
        )
    if not args.no_write:
        print(write_results("serve", results))
    return results


if __name__ == "__main__":
    main()
