"""transformers' tensor parallelism (`from_pretrained(..., tp_plan="auto")`) on 2 CPU processes (torchrun, gloo):
logits, a training step's loss and gradients, and greedy generation's logits equal one process, for MSSA, MHSA,
k-NN, the hybrid MLP ablation and the vision model; the tied MSSA output runs in inference and refuses training."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap

import pytest
import torch

from aot_transformers import AoTForCausalLM, AoTForImageClassification
from support import tiny_config

CASES = {
    "mssa": {},
    "mhsa": {"attention_type": "mhsa"},
    "knn": {"knn_k": 3},
    "hybrid": {"mlp_layers": "all"},
    "tied": {"tie_output_projection": True},
}
WORKER = textwrap.dedent(
    """
    import json, sys, torch, torch.distributed as dist
    from aot_transformers import AoTForCausalLM, AoTForImageClassification

    folder, names = sys.argv[1], sys.argv[2:]
    expected = torch.load(f"{folder}/expected.pt")
    ids, differences = expected["ids"], {}
    for name in names:
        model = AoTForCausalLM.from_pretrained(f"{folder}/{name}", tp_plan="auto").eval()
        with torch.no_grad():
            differences[name] = (model(ids).logits - expected[name]).abs().max().item()
            out = model.generate(ids[:, :5], max_new_tokens=4, do_sample=False, output_logits=True,
                                 return_dict_in_generate=True, pad_token_id=0)
            generated = torch.stack(out.logits, 1)
            differences[name + "/generate"] = (generated - expected[name + "/generate"]).abs().max().item()
        model.train()
        try:
            loss = model(ids, labels=ids).loss
            loss.backward()
        except NotImplementedError as error:
            differences[name + "/train"] = str(error)
            continue
        differences[name + "/loss"] = abs(loss.item() - expected[name + "/loss"].item())
        worst = 0.0
        for parameter_name, parameter in model.named_parameters():
            grad = parameter.grad.full_tensor() if hasattr(parameter.grad, "full_tensor") else parameter.grad
            worst = max(worst, (grad - expected[name + "/grads"][parameter_name]).abs().max().item())
        differences[name + "/grads"] = worst
    vision = AoTForImageClassification.from_pretrained(f"{folder}/vision", tp_plan="auto").eval()
    with torch.no_grad():
        differences["vision"] = (vision(expected["pixels"]).logits - expected["vision"]).abs().max().item()
    if dist.get_rank() == 0:
        json.dump(differences, open(f"{folder}/differences.json", "w"))
    """
)


def test_tensor_parallel_equals_one_process(tmp_path):
    ids = torch.randint(1, 97, (2, 9))
    expected = {"ids": ids, "pixels": torch.randn(2, 3, 16, 16)}
    for name, overrides in CASES.items():
        model = AoTForCausalLM(tiny_config(**overrides)).eval()
        model.save_pretrained(tmp_path / name)
        with torch.no_grad():
            expected[name] = model(ids).logits
            out = model.generate(
                ids[:, :5],
                max_new_tokens=4,
                do_sample=False,
                output_logits=True,
                return_dict_in_generate=True,
                pad_token_id=0,
            )
            expected[name + "/generate"] = torch.stack(out.logits, 1)
        loss = model.train()(ids, labels=ids).loss
        loss.backward()
        expected[name + "/loss"] = loss.detach()
        expected[name + "/grads"] = {n: p.grad for n, p in model.named_parameters()}
    vision = AoTForImageClassification(tiny_config()).eval()
    vision.save_pretrained(tmp_path / "vision")
    with torch.no_grad():
        expected["vision"] = vision(expected["pixels"]).logits
    torch.save(expected, tmp_path / "expected.pt")
    (tmp_path / "worker.py").write_text(WORKER)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [*torchrun, str(tmp_path / "worker.py"), str(tmp_path), *CASES],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    differences = json.loads((tmp_path / "differences.json").read_text())
    refused = differences.pop("tied/train")
    assert "tie_output_projection=True" in refused and "tensor parallelism" in refused
    assert all(value < 1e-5 for value in differences.values()), differences
    assert {"mssa/grads", "mhsa/grads", "knn/grads", "hybrid/grads", "tied/generate", "vision"} <= set(differences)


FSDP_WORKER = textwrap.dedent(
    """
    import json, sys, torch, torch.distributed as dist
    from transformers.distributed.configuration_utils import DistributedConfig
    from aot_transformers import AoTForCausalLM

    folder = sys.argv[1]
    expected = torch.load(f"{folder}/expected.pt")
    model = AoTForCausalLM.from_pretrained(
        f"{folder}/model", distributed_config=DistributedConfig(tp_size=2, fsdp_size=2)
    ).train()
    half = dist.get_rank() // 2  # ranks (0, 1) and (2, 3) are the tensor-parallel pairs of the two FSDP shards
    ids = expected["ids"].chunk(2)[half]
    loss = model(ids, labels=ids).loss
    loss.backward()
    losses = [None] * dist.get_world_size()
    dist.all_gather_object(losses, loss.item())
    differences = {"loss": abs(sum(losses) / len(losses) - expected["loss"].item()), "grads": 0.0}
    for name, parameter in model.named_parameters():
        grad = parameter.grad.full_tensor()
        differences["grads"] = max(differences["grads"], (grad - expected["grads"][name]).abs().max().item())
    if dist.get_rank() == 0:
        json.dump(differences, open(f"{folder}/differences.json", "w"))
    """
)


def test_tensor_parallel_with_fsdp_equals_one_process(tmp_path):
    """The path `aot train` takes with `parallelism_config` (tensor parallel 2 x FSDP2 2, 4 CPU processes): each FSDP
    shard's pair of ranks trains on its half of the batch; the mean loss and the gathered gradients equal one process
    on the whole batch."""
    model = AoTForCausalLM(tiny_config(vocab_size=1001)).train()
    model.save_pretrained(tmp_path / "model")
    ids = torch.randint(1, 1001, (4, 32))
    loss = model(ids, labels=ids).loss
    loss.backward()
    expected = {"ids": ids, "loss": loss.detach(), "grads": {n: p.grad for n, p in model.named_parameters()}}
    torch.save(expected, tmp_path / "expected.pt")
    (tmp_path / "worker.py").write_text(FSDP_WORKER)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "4"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [*torchrun, str(tmp_path / "worker.py"), str(tmp_path)], capture_output=True, text=True, env=env, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    differences = json.loads((tmp_path / "differences.json").read_text())
    assert differences["loss"] < 1e-5 and differences["grads"] < 1e-5, differences


@pytest.mark.parametrize(
    ("flags", "config", "message"),
    [
        ({"parallelism_config": {"tp_size": 2, "cp_size": 2}}, {}, "is not supported"),
        ({"parallelism_config": {"dp_shard_size": 2}}, {}, "needs tp_size >= 2"),
        ({}, {"num_attention_heads": 25, "hidden_size": 50}, "must divide the 25 attention heads"),
        ({}, {"tie_output_projection": True}, "tie_output_projection=True"),
        ({"fsdp": "full_shard"}, {}, "drop --fsdp"),
        ({"save_only_model": False}, {}, "--save_only_model true"),
        ({"resume_from_checkpoint": "auto"}, {}, "so cannot resume"),
        ({}, {}, "must equal the 1 processes"),  # this test runs in one process, not 2 x 2
    ],
)
def test_tensor_parallel_training_refuses_what_cannot_work(flags, config, message):
    from transformers import TrainingArguments

    from aot_transformers.training.arguments import TrainingSetupError
    from aot_transformers.training.model_setup import tensor_parallel_config

    flags = {"parallelism_config": {"tp_size": 2, "dp_shard_size": 2}, "save_only_model": True, **flags}
    args = TrainingArguments(output_dir="/tmp/unused", use_cpu=True, **flags)
    with pytest.raises(TrainingSetupError, match=re.escape(message)):
        tensor_parallel_config(args, tiny_config(**config))
    assert tensor_parallel_config(TrainingArguments(output_dir="/tmp/unused", use_cpu=True), tiny_config()) is None
