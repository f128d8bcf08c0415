"""FSDP on CPU processes (gloo), which Accelerate leaves out.

Accelerate turns a run into FSDP only when its processes are GPU-like (`AcceleratorState` switches the distributed
type to `FSDP` inside a branch taken for `MULTI_GPU`, `MULTI_NPU`, `MULTI_XPU`, …); CPU processes are `MULTI_CPU`,
so with `--use_cpu` the FSDP plugin that Trainer builds from `--fsdp`/`--fsdp_config` is silently dropped and the
run is plain DDP (every rank holds the whole model). PyTorch's FSDP2 (`fully_shard`) itself works on CPU tensors
with gloo. `enable_fsdp_on_cpu` hands the plugin to Accelerate as it would for GPUs, so `accelerator.prepare` shards
the model by `AoTLayer` and checkpoints are FSDP checkpoints — the CPU dry runs then exercise the cluster code path.
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)


def enable_fsdp_on_cpu(trainer) -> bool:
    """Make `trainer` use the FSDP plugin of its `TrainingArguments` when its processes run on the CPU (see the
    module docstring). Call it after building the Trainer and before training; returns whether it changed anything."""
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

    plugin_args = getattr(trainer.args, "fsdp_plugin_args", None)
    state = trainer.accelerator.state
    if plugin_args is None or trainer.is_fsdp_enabled or state.distributed_type != DistributedType.MULTI_CPU:
        return False
    plugin = FullyShardedDataParallelPlugin(**plugin_args)
    if state.mixed_precision != "no":
        plugin.set_mixed_precision(state.mixed_precision)
    state.distributed_type = DistributedType.FSDP
    state.fsdp_plugin = plugin
    trainer.is_fsdp_enabled = True
    logger.info("FSDP%s on %d CPU processes (gloo).", plugin.fsdp_version, state.num_processes)
    return True


__all__ = ["enable_fsdp_on_cpu"]
