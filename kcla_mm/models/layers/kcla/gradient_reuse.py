# Copyright (c) kcla_mm contributors. Licensed under the Apache License 2.0.
"""Whether a node's backward pass may write its results over the gradients
it received, as :class:`.CompiledUpdate` does to spare two block-sized
allocations per layer (at detection sizes each is a fresh ``mmap``, whose
pages fault in again at every train step).

Nothing guarantees that a node is the only holder of the gradients the
engine hands it: ``AddBackward`` passes one tensor to both of its inputs, a
leaf's ``AccumulateGrad`` may keep it as the leaf's ``.grad``, a tensor hook
may keep it (Grad-CAM does) or its storage, and ``cat``'s backward hands
out views of one larger gradient. Autograd itself accumulates in place only
into a gradient that nothing else holds (``InputBuffer``'s
``use_count() == 1``); the test here is the same, at the three levels that
can hold a tensor: the Python object's references, the ``TensorImpl``'s and
the storage's (counted by the kernels' ``holders``, which also leave out
memory that torch does not own: numpy's, DLPack's). What the counts are for
a gradient that nothing else holds depends on the versions of torch and
Python (the engine's argument tuple, the pybind argument, the frames of
``Function.backward``), so a probe node measures them once per process, and
checks that shared and kept gradients count differently; where it cannot
tell them apart, nothing is reused. Nor is anything while a Python trace or
profile function is set: one that reads the frames' locals (a debugger, a
call logger) holds references of its own, which shift the counts.
"""
import sys
import threading
from functools import lru_cache
from typing import List, Optional, Tuple

import torch
from torch import Tensor

# (Python references, TensorImpl references, storage references).
Holders = Tuple[int, int, int]

# What the probe's backward saw, while the probe runs.
_probe_seen: Optional[List[Tuple[Optional[Holders], ...]]] = None
_probe_lock = threading.Lock()


def holders(grad: Optional[Tensor]) -> Optional[Holders]:
    """The references to a contiguous gradient that spans the whole of a
    storage torch owns; None for anything else (none, a view, an expanded
    or offset one, numpy's memory, or no kernels to count with), which is
    never reused."""
    if grad is None:
        return None
    from .compiled import extension  # compiled imports this module
    ext = extension()
    if ext is None:
        return None
    impl, storage = ext.holders(grad)
    if impl < 0:
        return None
    return sys.getrefcount(grad), impl, storage


def traced() -> bool:
    """Whether a Python trace or profile function is set (module
    docstring)."""
    return sys.gettrace() is not None or sys.getprofile() is not None


def reusable_gradients(*grads: Optional[Tensor]) -> Tuple[bool, ...]:
    """For each gradient a node's ``backward(ctx, *grads)`` received,
    whether nothing but that call holds it. Call it first in the backward
    pass, with the gradients as received (the probe calibrates the count
    of references from there)."""
    seen = tuple(holders(grad) for grad in grads)
    if _probe_seen is not None:
        _probe_seen.append(seen)
        return (False, ) * len(grads)
    unshared = unshared_holders()
    return tuple(unshared is not None and h == unshared for h in seen)


class _Probe(torch.autograd.Function):
    """Two outputs, whose backward records their gradients' holders as
    :class:`.CompiledUpdate`'s backward counts them."""

    @staticmethod
    def forward(ctx, x: Tensor) -> Tuple[Tensor, Tensor]:
        return x.clone(), x.clone()

    @staticmethod
    def backward(ctx, grad_a: Tensor, grad_b: Tensor):
        reusable_gradients(grad_a, grad_b)
        return None


def _probe(loss) -> List[Tuple[Optional[Holders], ...]]:
    """The holders seen by the probe's backward in the backward pass of
    ``loss(x)``, which applies the probe to ``x``."""
    global _probe_seen
    _probe_seen = []
    try:
        with torch.enable_grad():
            x = torch.zeros(8, device='cpu', requires_grad=True)
            loss(x).backward()
        return _probe_seen
    finally:
        _probe_seen = None


def _unshared(x: Tensor, hook=None) -> Tensor:
    # Each output's gradient is a new tensor of its own MulBackward; a hook
    # on the first may keep it.
    a, b = _Probe.apply(x)
    if hook is not None:
        a.register_hook(hook)
    return (a * 2.).sum() + (b * 3.).sum()


def _shared_with_itself(x: Tensor) -> Tensor:
    # AddBackward hands one tensor to both outputs.
    a, b = _Probe.apply(x)
    return ((a + b) * 2.).sum()


def _shared_with_a_later_node(x: Tensor) -> Tensor:
    # AddBackward hands a's gradient to the MulBackward of y too, which runs
    # after the probe (made before it).
    y = x * 1.
    a, b = _Probe.apply(x)
    return ((a + y) * 2.).sum() + (b * 3.).sum()


def _kept_by_a_hook(x: Tensor) -> Tensor:
    return _unshared(x, hook=[].append)


def _storage_kept_by_a_hook(x: Tensor) -> Tensor:
    kept = []
    return _unshared(x, hook=lambda grad: kept.append(grad.untyped_storage()))


def unshared_holders() -> Optional[Holders]:
    """The holders of a gradient that nothing but the backward call holds;
    None where the probe cannot tell a shared or kept gradient from it, and
    while a trace or profile function is set. Measured once, at the first
    call without one (outside any backward pass: :func:`.compiled_update`
    calls it before its node)."""
    return None if traced() else _calibrated()


@lru_cache(maxsize=None)
def _calibrated() -> Optional[Holders]:
    with _probe_lock:
        unshared = _probe(_unshared)
        shared = [
            _probe(loss)
            for loss in (_shared_with_itself, _shared_with_a_later_node,
                         _kept_by_a_hook, _storage_kept_by_a_hook)
        ]
    if len(unshared) != 1 or any(len(seen) != 1 for seen in shared):
        return None
    base = unshared[0][0]
    if base is None or unshared[0][1] != base:
        return None
    # Each probe's first output is shared or kept; a reuse there would
    # change a gradient that something else reads.
    if any(seen[0][0] == base for seen in shared):
        return None
    return base
