# Copyright (c) kcla_mm contributors. Licensed under the Apache License 2.0.
"""Where a KCLA-ResNet's extra time goes: the wall time of each phase of
the KCLA layers inside one eval forward and one train step.

The phases are the functions that the layer's implementation calls
(:data:`PHASES`); :func:`timed_phases` wraps them with timers for the
duration of a ``with`` block. Timers are exclusive: a phase called inside
another (Algorithm 1 replayed while the state tape recomputes a stage) is
counted once, in its own row. What no phase covers (the autograd engine's
work on the pooled vectors, drop-path masks, the layers' Python) is the
difference between the KCLA and the ResNet step time, less the phases.
Profiling is a measurement: nothing here asserts.
"""
import time
from collections import defaultdict
from contextlib import contextmanager
from typing import Dict, Iterator, List, Tuple

from ..models.layers.kcla import compiled as kcla_compiled
from ..models.layers.kcla import fused as kcla_fused
from ..models.layers.kcla import recompute as kcla_recompute

#: (label, module or class, attribute) of each phase, per implementation;
#: the module is the one whose global the layer's code looks up.
PHASES: Dict[str, List[Tuple[str, object, str]]] = {
    'compiled': [
        ('Algorithm 1 (re-normalisation), forward', kcla_compiled,
         'renormalise_in_forward'),
        ('Algorithm 1 (re-normalisation), forward', kcla_recompute,
         'fused_renormalise'),
        ('Algorithm 1, backward', kcla_recompute, 'grads_of'),
        ('pooled vectors (Q/K, weights, gate), C++, inference', 'extension',
         'pooled_forward'),
        ('pooled vectors (Q/K, weights, gate), PyTorch', kcla_recompute,
         'fused_query_key'),
        ('pooled vectors (Q/K, weights, gate), PyTorch', kcla_recompute,
         'gate_and_weight'),
        ('state update + branch, C++ forward', 'extension', 'branch_forward'),
        ('state update + branch, C++ backward', 'extension',
         'branch_backward'),
        ('states recomputed for backward (tape)', kcla_recompute.StateTape,
         'state'),
    ],
    'fused': [
        ('Algorithm 1 (re-normalisation), forward', kcla_fused,
         'renormalise_in_forward'),
        ('pooled vectors (Q/K, weights, gate), PyTorch', kcla_fused,
         'fused_query_key'),
        ('pooled vectors (Q/K, weights, gate), PyTorch', kcla_fused,
         'gate_and_weight'),
        ('state update, PyTorch', kcla_fused, 'head_scaled_add'),
        ('branch (folded conv, norm, ReLU), PyTorch', kcla_fused,
         'folded_value'),
        ('residual add, PyTorch', kcla_fused, 'add_branch'),
    ],
}


def resolve(owner: object) -> object:
    """The object whose attribute is wrapped: ``'extension'`` stands for
    the compiled kernels' module, which exists only where it was built."""
    return kcla_compiled.require_extension() if owner == 'extension' else owner


@contextmanager
def timed_phases(implementation: str) -> Iterator[Dict[str, float]]:
    """Within the block, the phases of ``implementation`` ('compiled' or
    'fused', see :data:`PHASES`) add their exclusive wall time in seconds
    to the yielded dict, by label."""
    if implementation not in PHASES:
        raise ValueError(f'implementation={implementation!r}: phases are '
                         f'known for {sorted(PHASES)}')
    totals: Dict[str, float] = defaultdict(float)
    # Time spent in nested timed calls, per open call.
    nested: List[float] = []
    originals = []

    def timer(label: str, fn):

        def timed(*args, **kwargs):
            nested.append(0.0)
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                elapsed = time.perf_counter() - start
                totals[label] += elapsed - nested.pop()
                if nested:
                    nested[-1] += elapsed

        return timed

    try:
        for label, owner, name in PHASES[implementation]:
            target = resolve(owner)
            fn = getattr(target, name)
            originals.append((target, name, fn))
            setattr(target, name, timer(label, fn))
        yield totals
    finally:
        for target, name, fn in reversed(originals):
            setattr(target, name, fn)
