# Copyright (c) kcla_mm contributors. Licensed under the Apache License 2.0.
"""Profiler labels for the phases of the KCLA layers.

``with phase('branch'):`` puts the block under a
``torch.profiler.record_function('kcla::branch')`` label while a profiler
runs (:func:`kcla_mm.analysis.phase_profile.timed_phases` reads them), and
costs a flag check otherwise: ``record_function`` itself takes some
microseconds per block even with no profiler running (about 5 us against
0.2-0.4 us for the check, CPU, torch 2.1 and 2.13), which the layers,
timed per block, should not pay. Only phase-level blocks are labelled.
"""
import contextlib
from typing import ContextManager, Dict

import torch
from torch.profiler import record_function

from ...torch_compat import is_compiling

__all__ = ['PREFIX', 'PHASES', 'phase']

#: The prefix of every label.
PREFIX = 'kcla::'

#: The labelled phases: name -> what it covers.
PHASES: Dict[str, str] = {
    'renormalise': 'Algorithm 1 (re-normalisation), forward',
    'pooled': 'pooled vectors (Q/K, weights, gate)',
    'state_update': 'state update, PyTorch',
    'branch': 'branch (folded conv, norm, ReLU), PyTorch',
    'residual': 'residual add, PyTorch',
    'update_branch': 'state update + branch, C++ forward',
    'update_branch_backward': 'state update + branch, C++ backward',
    'backward': 'recomputed graph, backward (Algorithm 1, update, branch)',
    'tape': 'states recomputed for backward (tape)',
    'output_recompute': 'layer outputs recomputed for the next block, C++',
}

_NO_LABEL = contextlib.nullcontext()


def phase(name: str) -> ContextManager:
    """A ``record_function`` label ``'kcla::<name>'`` (``name`` one of
    :data:`PHASES`) while an autograd profiler runs, else a no-op; never
    under torch.compile, whose tracer would break the graph at the
    profiler query."""
    if not is_compiling() and torch.autograd._profiler_enabled():
        return record_function(PREFIX + name)
    return _NO_LABEL
