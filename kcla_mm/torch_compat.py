# Copyright (c) kcla_mm contributors. Licensed under the Apache License 2.0.
"""Shims for the torch APIs that changed between the releases kcla_mm
supports (torch >= 2.0; CI tests 2.1.2 and 2.13.0).

The rest of the package calls these, never the version-specific API. The
version checks run once, at import; :func:`has_mem_tracker` looks for its
module when called, and :func:`onnx_export_flags` for the ONNX exporters'
at its first call, so that importing kcla_mm imports neither
torch.distributed nor those.
"""
import importlib.util
import sys
from functools import lru_cache
from typing import Any, Optional, Sequence, Tuple

import torch
from mmengine.utils import digit_version

TORCH_VERSION = digit_version(torch.__version__)

#: Whether ``torch.load`` reads checkpoints with ``weights_only=True`` by
#: default and ``torch.serialization.add_safe_globals`` takes
#: ``(callable, 'module.name')`` pairs: both came with torch 2.6. Before it,
#: mmengine's ``torch.load`` calls unpickle checkpoints in full, so training
#: checkpoints load without any allow-list.
WEIGHTS_ONLY_ALLOW_LIST = TORCH_VERSION >= digit_version('2.6.0')

# torch 2.4 gave torch.is_autocast_enabled a device_type argument.
_AUTOCAST_QUERY_TAKES_DEVICE = TORCH_VERSION >= digit_version('2.4.0')


def is_autocast_enabled(device_type: str) -> bool:
    """Whether autocast is on for ``device_type`` ('cpu', 'cuda', ...).

    ``torch.is_autocast_enabled(device_type)`` from torch 2.4; before it,
    :func:`autocast_enabled_by_device_query`.
    """
    if _AUTOCAST_QUERY_TAKES_DEVICE:
        return torch.is_autocast_enabled(device_type)
    return autocast_enabled_by_device_query(device_type)


def autocast_enabled_by_device_query(device_type: str) -> bool:
    """The autocast query of torch < 2.4: ``torch.is_autocast_enabled()``
    for CUDA, ``torch.is_autocast_<device>_enabled()`` for the others (False
    for a device type that has none)."""
    if device_type == 'cuda':
        return torch.is_autocast_enabled()
    query = getattr(torch, f'is_autocast_{device_type}_enabled', None)
    return bool(query()) if query is not None else False


def is_compiling() -> bool:
    """Whether torch.compile (dynamo) is tracing the caller.

    ``torch.compiler.is_compiling`` from torch 2.3, ``torch._dynamo``'s
    before it (not imported here: where nothing imported dynamo, nothing is
    compiling). Dynamo folds either to True while tracing, so a branch on
    it costs no graph break.
    """
    query = getattr(getattr(torch, 'compiler', None), 'is_compiling', None)
    if query is not None:
        return query()
    # Not getattr(torch, '_dynamo'): torch 2.1 would import it then.
    dynamo = sys.modules.get('torch._dynamo')
    return dynamo is not None and dynamo.is_compiling()


def checkpoint_hooks_active() -> bool:
    """Whether the caller runs inside a non-reentrant activation checkpoint
    (``torch.utils.checkpoint`` with ``use_reentrant=False``,
    ``checkpoint_wrapper``): its saved-tensor hooks are the innermost ones
    set, and they let each saved tensor be unpacked only once.

    torch 2.13 tells through ``_top_saved_tensors_default_hooks``; torch
    2.1 has no such query, and there it is False.
    """
    query = getattr(torch._C._autograd, '_top_saved_tensors_default_hooks',
                    None)
    hooks = query(True) if query is not None else None
    return (hooks is not None and getattr(hooks[0], '__module__', None)
            == 'torch.utils.checkpoint')


def in_process_group() -> bool:
    """Whether this process belongs to an initialised process group of more
    than one process (where a wrapper may shard parameters)."""
    dist = torch.distributed
    return (dist.is_available() and dist.is_initialized()
            and dist.get_world_size() > 1)


@lru_cache(maxsize=None)
def onnx_export_flags() -> Optional[Tuple[Any, Any]]:
    """(the TorchScript exporter's ``GLOBALS``, the dynamo exporter's
    ``_flags`` module), found at the first call: the two flags that
    ``torch.onnx.is_in_onnx_export`` of torch 2.13 reads, importing both
    modules at every call (1.1 of the 1.6 us that :func:`is_exporting`
    took, which every layer of an inference pays); None where torch keeps
    them elsewhere (torch 2.1 reads one global of its own, cheaply), and
    :func:`is_exporting` then asks torch. tests/test_torch_compat.py pins
    that both answer alike."""
    try:
        from torch.onnx._internal.exporter import _flags
        from torch.onnx._internal.torchscript_exporter._globals import GLOBALS
    except ImportError:
        return None
    if not (hasattr(GLOBALS, 'in_onnx_export')
            and hasattr(_flags, '_is_onnx_exporting')):
        return None
    return GLOBALS, _flags


def is_exporting() -> bool:
    """Whether the caller is being recorded into a graph for deployment:
    ``torch.jit.trace`` / ``torch.jit.script`` (which the TorchScript ONNX
    exporter uses), ``torch.onnx.export`` or ``torch.export`` (from torch
    2.5, ``torch.compiler.is_exporting``; before it ``torch.export`` runs
    dynamo, which :func:`is_compiling` sees).

    The fast paths that a recorder cannot see into (C++ kernels, custom
    autograd Functions) or that would record different operators than the
    paper's (folded weights, matmul convs) step aside there.
    """
    if torch.jit.is_tracing() or torch.jit.is_scripting():
        return True
    # Under torch.compile, torch's own query, which dynamo knows; it would
    # break the graph at onnx_export_flags.
    flags = None if is_compiling() else onnx_export_flags()
    if flags is None:
        if torch.onnx.is_in_onnx_export():
            return True
    elif flags[0].in_onnx_export or flags[1]._is_onnx_exporting:
        return True
    query = getattr(getattr(torch, 'compiler', None), 'is_exporting', None)
    return query is not None and bool(query())


def has_mem_tracker() -> bool:
    """Whether torch has ``torch.distributed._tools.mem_tracker.MemTracker``
    (torch 2.13 has it, torch 2.1 not), which accounts the peak memory of a
    train step on any device, the CPU included."""
    try:
        return importlib.util.find_spec(
            'torch.distributed._tools.mem_tracker') is not None
    except ModuleNotFoundError:  # no torch.distributed._tools at all
        return False


def add_safe_globals(safe_globals: Sequence[Any]) -> bool:
    """Allow-lists ``safe_globals`` for ``torch.load(weights_only=True)``
    where torch has the allow-list in the form kcla_mm needs (see
    :data:`WEIGHTS_ONLY_ALLOW_LIST`).

    Returns:
        bool: Whether they were registered. Where they were not, checkpoints
        that need them do not load with ``weights_only=True``; load them as
        mmengine does on that torch (:func:`load_checkpoint_file`).
    """
    if not WEIGHTS_ONLY_ALLOW_LIST:
        return False
    torch.serialization.add_safe_globals(list(safe_globals))
    return True


def load_checkpoint_file(path: str) -> Any:
    """Loads a checkpoint file to the CPU as mmengine does on this torch.

    torch >= 2.6: ``weights_only=True``, so a training checkpoint loads only
    once its types are allow-listed (``import kcla_mm`` does it, see
    :mod:`kcla_mm.utils.checkpoint_safety`). Older torch has no such
    allow-list, and its ``torch.load`` default (full unpickling) is
    what mmengine's own loading uses there: only open checkpoints you trust.
    """
    if WEIGHTS_ONLY_ALLOW_LIST:
        return torch.load(path, map_location='cpu', weights_only=True)
    return torch.load(path, map_location='cpu')
