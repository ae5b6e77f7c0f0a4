# Copyright (c) kcla_mm contributors. Licensed under the Apache License 2.0.
"""The KCLA layer: the module and its reference forward (:mod:`.layer`),
the recurrent state (:mod:`.state`), the fast implementations beside the
reference (:mod:`.fused`, :mod:`.recompute`, :mod:`.compiled`), the table
that picks one per call (:mod:`.dispatch`), the fused end of a residual
block in inference (:mod:`.block_tail`) and in a train step
(:mod:`.train_tail`), and the next block's convs that recompute the
layer's output (:mod:`.recomputed_input`)."""
from .dispatch import IMPLEMENTATIONS, select_implementation
from .layer import KCLALayer, head_temperatures
from .state import STATE_EPS, KCLAState

__all__ = [
    'IMPLEMENTATIONS', 'KCLALayer', 'KCLAState', 'STATE_EPS',
    'head_temperatures', 'select_implementation'
]
