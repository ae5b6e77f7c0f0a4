# Copyright (c) kcla_mm contributors. Licensed under the Apache License 2.0.
"""The one place where kcla_mm widens ``torch.load(weights_only=True)``.

torch >= 2.6 loads checkpoints with ``weights_only=True``: only tensors and
plain containers unless a type is allow-listed. mmengine 0.10.7 stores its
MessageHub (``HistoryBuffer`` objects holding numpy arrays and scalars) in
every training checkpoint, so ``--resume``, testing a training checkpoint
and the inferencers fail out of the box, in kcla_mm's tools and in mmdet's
and mmseg's own. ``import kcla_mm`` (what ``custom_imports`` does) calls
:func:`allow_mmengine_checkpoint_types` once, which admits exactly:

* ``mmengine.logging.HistoryBuffer`` and ``collections.Counter``;
* numpy's ``ndarray``, ``dtype``, the dtype classes of float64, float32,
  float16, int64, int32 and bool, and the two reconstructors pickle uses
  for arrays and scalars (``numpy.core.multiarray._reconstruct`` and
  ``scalar``);
* ``getattr``, replaced by a stand-in that reaches only
  ``HistoryBuffer.min``, ``.max``, ``.mean`` and ``.current`` (how
  HistoryBuffer pickles its statistics methods).

weights_only stays on: a checkpoint holding anything else is refused. torch
< 2.6 has no such allow-list (nor the weights_only default): there mmengine
unpickles its checkpoints in full, and the call does nothing.
"""
import pickle
from collections import Counter

import numpy as np
from mmengine.logging import HistoryBuffer

from ..torch_compat import add_safe_globals


def _numpy_types():
    try:  # numpy 1.x; numpy 2 moved these to numpy._core
        from numpy.core.multiarray import _reconstruct, scalar
    except ImportError:  # pragma: no cover - numpy 2
        from numpy._core.multiarray import _reconstruct, scalar
    dtype_classes = [
        type(np.dtype(t)) for t in (np.float64, np.float32, np.float16,
                                    np.int64, np.int32, np.bool_)
    ]
    return [_reconstruct, scalar, np.ndarray, np.dtype, *dtype_classes]


# HistoryBuffer pickles its statistics methods as getattr(HistoryBuffer,
# 'min'), etc. Allowing the builtin getattr would let a checkpoint reach any
# attribute of any allowed object; this stand-in reaches only these.
_HISTORY_BUFFER_METHODS = ('min', 'max', 'mean', 'current')


def _history_buffer_getattr(obj, name: str):
    if obj is HistoryBuffer and name in _HISTORY_BUFFER_METHODS:
        return getattr(HistoryBuffer, name)
    raise pickle.UnpicklingError(
        f'checkpoint asks for getattr({obj!r}, {name!r}); only '
        f'HistoryBuffer.{{{", ".join(_HISTORY_BUFFER_METHODS)}}} are allowed')


def allow_mmengine_checkpoint_types() -> bool:
    """Registers the non-tensor types of an mmengine training checkpoint as
    safe for ``torch.load(weights_only=True)``.

    Returns:
        bool: Whether this torch has the allow-list (torch >= 2.6).
    """
    return add_safe_globals([
        HistoryBuffer,
        Counter,
        *_numpy_types(),
        (_history_buffer_getattr, '__builtin__.getattr'),
        (_history_buffer_getattr, 'builtins.getattr'),
    ])
