# Copyright (c) kcla_mm contributors. Licensed under the Apache License 2.0.
"""Which implementation of :class:`~.KCLALayer` runs a call: one table,
:data:`DISPATCH`, read by one function, :func:`select_implementation`.

All implementations compute the function of
:meth:`KCLALayer.forward_reference`; they differ in speed and memory and in
what they cover. The layer keeps the name of the one that ran its last call
in ``KCLALayer.last_implementation``.
"""
from typing import Callable, Optional, Tuple

from torch import Tensor

from ....torch_compat import is_exporting
from .compiled import compiled_applies, compiled_unmet
from .params import KCLAParams
from .recompute import replayable
from .state import KCLAState

#: What ``implementation`` may ask for.
IMPLEMENTATIONS = ('auto', 'compiled', 'fused', 'reference', 'recompute')

Condition = Callable[[KCLAParams, Tensor, Optional[KCLAState]], bool]


def always(p: KCLAParams, x: Tensor, state: Optional[KCLAState]) -> bool:
    """The condition of a row that always applies."""
    return True


def exporting(p: KCLAParams, x: Tensor, state: Optional[KCLAState]) -> bool:
    """While ``torch.jit.trace``, ``torch.onnx.export`` or ``torch.export``
    records the call (:func:`.is_exporting`): the graph then holds the
    paper's operators, not the kernels (which a recorder sees as constants)
    nor the fused path's per-sample folded weights (a conv whose kernel
    the ONNX exporter cannot shape, and a traced one fixes the batch size).
    ``'fused'`` asked for stays fused: FLOP counts trace it
    (:func:`kcla_mm.analysis.complexity.fused_kcla_while_traced`)."""
    return is_exporting()


def recomputes(p: KCLAParams, x: Tensor, state: Optional[KCLAState]) -> bool:
    """A train step that :func:`.recompute.replayable` covers."""
    return replayable(p, x, state)


#: (implementations asked for, condition, what runs): the first row that
#: lists the layer's ``implementation`` and whose condition holds for the
#: call decides. ``'compiled'`` asked for where no row applies is an
#: error that names the condition that fails (:func:`.compiled_unmet`).
DISPATCH: Tuple[Tuple[Tuple[str, ...], Condition, str], ...] = (
    (('reference', ), always, 'reference'),
    (('auto', 'recompute'), exporting, 'reference'),
    (('auto', 'compiled'), compiled_applies, 'compiled'),
    (('recompute', ), recomputes, 'recompute'),
    (('auto', 'fused', 'recompute'), always, 'fused'),
)


def select_implementation(asked: str, p: KCLAParams, x: Tensor,
                          state: Optional[KCLAState]) -> str:
    """The implementation that runs a call ``layer(x, state)`` of a layer
    whose ``implementation`` is ``asked`` and whose tensors are ``p``:
    ``'reference'``, ``'compiled'``, ``'recompute'`` or ``'fused'``
    (:data:`DISPATCH`).

    Raises:
        RuntimeError: ``implementation='compiled'`` where the kernels do
            not cover the call; the message names the condition.
    """
    for implementations, condition, runs in DISPATCH:
        if asked in implementations and condition(p, x, state):
            return runs
    if asked == 'compiled':
        raise RuntimeError(
            "KCLALayer(implementation='compiled') cannot run this call: "
            f'{compiled_unmet(p, x, state)} does not hold (input '
            f'{x.dtype} on {x.device.type}); use '
            "implementation='auto' to fall back to 'fused' there")
    raise ValueError(f'implementation={asked!r} must be one of '
                     f'{IMPLEMENTATIONS}')
