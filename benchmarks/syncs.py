"""Count host syncs: operations that read a tensor's values into Python (or otherwise wait for the device to finish
and copy to the host), and so stall an accelerator's queue.

    with count_host_syncs() as syncs:
        model(input_ids)
    syncs.count, syncs.by_op, syncs.by_site

`count_host_syncs()` is a `TorchDispatchMode`: it sees every aten operator that runs below autograd, on any device,
so the count is the same on CPU as it would be on a GPU. Counted:

- `_local_scalar_dense`: `t.item()`, `int(t)`, `float(t)`, `bool(t)`, `if t:`, `t == x` used as a condition;
- `nonzero` (and `torch.where(cond)` with one argument), `masked_select`, `equal`, `allclose`, `is_nonzero`;
- `unique` (`_unique`, `_unique2`, `unique_consecutive`, `unique_dim`, `unique_dim_consecutive`), `bincount`;
- `repeat_interleave` with a tensor of repeats and no `output_size`;
- indexing with a boolean mask (`x[mask]`, `x[mask] = y`: `index` / `index_put_` with a bool or uint8 index), which
  on an accelerator runs a `nonzero` to size its output;
- a copy from an accelerator to the CPU (`.cpu()`, `.to("cpu")`, `copy_` into a CPU tensor: never on a CPU run);
- `Tensor.tolist()` and `Tensor.numpy()`, which read the data without going through the dispatcher (wrapped while the
  mode is active).

Not counted: `torch._assert_async` (checked on the device, no wait), and anything that reads only shapes. A CPU run
cannot see a host copy that the code makes only on an accelerator (e.g. `.cpu()` on a CPU tensor is a no-op), so
the counts are a lower bound for such code; every other entry above is device-independent.
"""

from __future__ import annotations

import traceback
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten

# Operators that always read device data on the host, by their overload packet.
ALWAYS_SYNC = {
    aten._local_scalar_dense,
    aten.nonzero,
    aten.equal,
    aten.allclose,
    aten.is_nonzero,
    aten.masked_select,
    aten._unique,
    aten._unique2,
    aten.unique_consecutive,
    aten.unique_dim,
    aten.unique_dim_consecutive,
    aten.bincount,
}
# Not a sync: the device checks the condition asynchronously.
NOT_SYNC = {aten._assert_async}
_INDEX_OPS = {aten.index, aten.index_put, aten.index_put_, aten._index_put_impl_}
_HOST_READS = ("tolist", "numpy")


def _is_sync(func, args, kwargs) -> bool:
    packet = func.overloadpacket
    if packet in NOT_SYNC:
        return False
    if packet in ALWAYS_SYNC:
        return True
    if packet is aten.repeat_interleave:
        # `repeat_interleave.Tensor(repeats, *, output_size)` (the `self_Tensor` overload decomposes into it).
        return func is aten.repeat_interleave.Tensor and kwargs.get("output_size") is None
    if packet in _INDEX_OPS:
        indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
        return any(
            isinstance(index, torch.Tensor) and index.dtype in (torch.bool, torch.uint8) for index in indices or ()
        )
    if packet is aten._to_copy:
        device = kwargs.get("device")
        return device is not None and torch.device(device).type == "cpu" and args[0].device.type != "cpu"
    if packet is aten.copy_:
        return args[0].device.type == "cpu" and args[1].device.type != "cpu"
    return False


_TORCH_DIR = str(Path(torch.__file__).parent)
_THIS_FILE = str(Path(__file__).resolve())
_PREFIXES = ("site-packages/", "/src/", "/benchmarks/", "/tests/")


def _short(filename: str) -> str:
    for prefix in _PREFIXES:
        if prefix in filename:
            return filename.rsplit(prefix, 1)[1]
    return filename


def _site(stack_depth: int = 1) -> str:
    """Where the sync comes from: the innermost frame(s) outside torch and this file, as `path:line (function)`."""
    frames = [
        frame
        for frame in traceback.extract_stack()
        if not frame.filename.startswith(_TORCH_DIR)
        and frame.filename != _THIS_FILE
        and not frame.filename.endswith("contextlib.py")
    ]
    return " < ".join(f"{_short(f.filename)}:{f.lineno} ({f.name})" for f in reversed(frames[-stack_depth:]))


@dataclass
class SyncCounter:
    """The host syncs seen: one `(op, site)` event per sync, in order."""

    events: list[tuple[str, str]] = field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.events)

    @property
    def by_op(self) -> Counter:
        return Counter(op for op, _ in self.events)

    @property
    def by_site(self) -> Counter:
        return Counter(f"{op} @ {site}" for op, site in self.events)

    def __repr__(self) -> str:
        lines = [f"{self.count} host syncs"] + [f"  {n} x {where}" for where, n in self.by_site.most_common()]
        return "\n".join(lines)


class _SyncMode(TorchDispatchMode):
    def __init__(self, counter: SyncCounter, stack_depth: int):
        super().__init__()
        self.counter = counter
        self.stack_depth = stack_depth

    def record(self, op: str) -> None:
        self.counter.events.append((op, _site(self.stack_depth) if self.stack_depth else ""))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _is_sync(func, args, kwargs):
            op = str(func.overloadpacket).removeprefix("aten.")
            self.record(f"{op} (boolean mask)" if func.overloadpacket in _INDEX_OPS else op)
        return func(*args, **kwargs)


@contextmanager
def count_host_syncs(stack_depth: int = 1) -> Iterator[SyncCounter]:
    """Count the host syncs run inside the block (see the module docstring for what counts).

    `stack_depth` frames outside torch (innermost first) are recorded per sync as its site; 0 records none (faster).
    """
    counter = SyncCounter()
    mode = _SyncMode(counter, stack_depth)
    originals = {name: torch.Tensor.__dict__.get(name) for name in _HOST_READS}

    def wrap(name):
        method = getattr(torch.Tensor, name)

        def read(self, *args, **kwargs):
            mode.record(name)
            return method(self, *args, **kwargs)

        return read

    for name in _HOST_READS:
        setattr(torch.Tensor, name, wrap(name))
    try:
        with mode:
            yield counter
    finally:
        for name, original in originals.items():
            if original is None:
                delattr(torch.Tensor, name)
            else:
                setattr(torch.Tensor, name, original)


__all__ = ["ALWAYS_SYNC", "NOT_SYNC", "SyncCounter", "count_host_syncs"]
