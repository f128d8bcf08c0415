"""Train a GPT-2-shaped tiny LM and an AoT of equal parameters the same way, for the zero-shot suite comparison.

    python -m benchmarks.eval.train_pair --models gpt2         # ~6 minutes on 2 busy shared cores
    python -m benchmarks.eval.train_pair --models aot          # the same data, order and schedule
    python -m benchmarks.eval.train_pair --steps 20 --output-dir out/eval_bench_smoke   # a smoke run

Both models: GPT-2 tokenizer (../shared/data/tokenizer-gpt2), width 128, 4 heads, tied embeddings, 256 positions,
no dropout; the same token blocks in the same order (Jane Austen's novels, ../shared/data/text/janeausten, the last
5% held out), AdamW, the same learning-rate schedule, a plain loop. Shapes at equal non-embedding parameters:
GPT-2 4 layers (attention 4d² + MLP 8d² per layer) vs AoT-MSSA 24 layers (2d² per layer, no MLP).
Writes the two model folders (loadable with `AutoModelForCausalLM.from_pretrained(..., trust_remote_code=True)`)
and `training.json` into --output-dir.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, GPT2TokenizerFast

from aot_transformers import AoTConfig, AoTForCausalLM

from .._common import invocation, write_results
from ..peers import peer_model

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared" / "data"
WIDTH, HEADS, POSITIONS = 128, 4, 256


def build_models(vocab_size: int, gpt2_layers: int = 4, aot_layers: int = 24) -> dict[str, torch.nn.Module]:
    """The GPT-2-shaped model and the AoT of equal non-embedding parameters, both freshly initialised."""
    gpt2 = peer_model(
        AutoModelForCausalLM,
        "gpt2",
        vocab_size=vocab_size,
        hidden_size=WIDTH,
        num_hidden_layers=gpt2_layers,
        num_attention_heads=HEADS,
        max_position_embeddings=POSITIONS,
        bos_token_id=50256,
        eos_token_id=50256,
    )
    aot = AoTForCausalLM(
        AoTConfig.from_preset(
            "aot-mssa-l-tiny",
            vocab_size=vocab_size,
            hidden_size=WIDTH,
            num_hidden_layers=aot_layers,
            num_attention_heads=HEADS,
            max_position_embeddings=POSITIONS,
            bos_token_id=50256,
            eos_token_id=50256,
        )
    )
    return {"gpt2": gpt2, "aot": aot}


def parameter_counts(model: torch.nn.Module) -> dict[str, int]:
    """Total parameters, and without the token and position embeddings (the paper's comparison)."""
    unique = {id(p): p for p in model.parameters()}
    total = sum(p.numel() for p in unique.values())
    embeddings = sum(module.weight.numel() for module in model.modules() if isinstance(module, torch.nn.Embedding))
    return {"total": total, "non_embedding": total - embeddings}


def token_blocks(tokenizer, folder: Path, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(train, validation) blocks of `block + 1` tokens from the novels, EOS between books, last 5% held out."""
    ids: list[int] = []
    for path in sorted(folder.glob("*.txt")):
        ids += tokenizer(path.read_text(encoding="utf-8"))["input_ids"] + [tokenizer.eos_token_id]
    data = torch.tensor(ids)
    split = int(0.95 * len(data))
    train, valid = data[:split], data[split:]
    as_blocks = lambda t: t[: (len(t) // (block + 1)) * (block + 1)].view(-1, block + 1)
    return as_blocks(train), as_blocks(valid)


@torch.no_grad()
def validation_loss(model: torch.nn.Module, blocks: torch.Tensor, batch: int) -> float:
    model.eval()
    losses = [float(model(input_ids=b, labels=b).loss) for b in blocks.split(batch)]
    model.train()
    return sum(losses) / len(losses)


def train(model, blocks, steps: int, batch: int, lr: float, seed: int, log_every: int = 25) -> dict:
    """AdamW, linear warmup then cosine decay; the block order depends only on `seed`."""
    generator = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(blocks), generator=generator)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
    warmup = max(1, steps // 10)
    schedule = lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    model.train()
    curve, start = [], time.perf_counter()
    for step in range(steps):
        index = order[(step * batch + torch.arange(batch)) % len(order)]
        batch_ids = blocks[index]
        loss = model(input_ids=batch_ids, labels=batch_ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        if step % log_every == 0 or step == steps - 1:
            value = float(loss.detach())
            curve.append((step, value))
            print(f"  step {step:4d}  loss {value:.3f}  {time.perf_counter() - start:6.0f}s", flush=True)
    return {"seconds": time.perf_counter() - start, "curve": curve, "final_train_loss": curve[-1][1]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", type=Path, default=SHARED / "text" / "janeausten")
    parser.add_argument("--tokenizer", type=Path, default=SHARED / "tokenizer-gpt2")
    parser.add_argument("--output-dir", type=Path, default=ROOT / "out" / "eval_bench")
    parser.add_argument("--models", default="gpt2,aot", help="which to train (one per run keeps runs short)")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--block", type=int, default=128)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    tokenizer = GPT2TokenizerFast.from_pretrained(args.tokenizer)
    train_blocks, valid_blocks = token_blocks(tokenizer, args.data_dir, args.block)
    valid_blocks = valid_blocks[:64]
    print(f"{len(train_blocks)} training blocks, {len(valid_blocks)} validation blocks of {args.block + 1} tokens")
    torch.manual_seed(args.seed)
    models = build_models(len(tokenizer))
    report_path = args.output_dir / "training.json"
    report = json.loads(report_path.read_text()) if report_path.exists() else {"models": {}}
    report["settings"] = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items() if k != "models"}
    for name in args.models.split(","):
        model = models[name]
        torch.manual_seed(args.seed)
        print(f"{name}: {parameter_counts(model)}")
        result = train(model, train_blocks, args.steps, args.batch_size, args.lr, args.seed)
        result["validation_loss"] = validation_loss(model, valid_blocks, args.batch_size)
        result["parameters"] = parameter_counts(model)
        result["tokens_per_second"] = args.steps * args.batch_size * args.block / result["seconds"]
        print(f"{name}: validation loss {result['validation_loss']:.3f} after {result['seconds']:.0f}s")
        folder = args.output_dir / name
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        report["models"][name] = {**result, "folder": str(folder)}
        write_results(report_path, report, invocation("benchmarks.eval.train_pair", argv))
    print(f"wrote {report_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
