# Copyright (c) kcla_mm contributors. Licensed under the Apache License 2.0.
"""Where a KCLA-ResNet's extra time goes: the wall time of each phase of
the KCLA layers inside one eval forward and one train step.

The layers label their phases with ``torch.profiler.record_function``
(``kcla::<name>``, :data:`kcla_mm.models.layers.profiling.PHASES`, emitted
only while a profiler runs); :func:`timed_phases` runs
``torch.profiler.profile`` over a ``with`` block and sums, per phase, the
labels' CPU wall time. Times are exclusive: a phase inside another
(Algorithm 1 replayed while the state tape recomputes a stage) is counted
once, in its own row. What no phase covers (the autograd engine's work on
the pooled vectors, drop-path masks, the layers' Python) is the difference
between the KCLA and the ResNet step time, less the phases. The profiler
records every operator in the block, which slows it somewhat: time the
step itself outside :func:`timed_phases`. Profiling is a measurement:
nothing here asserts.
"""
from collections import defaultdict
from contextlib import contextmanager
from typing import Dict, Iterable, Iterator

from torch.profiler import ProfilerActivity, profile

from ..models.layers.profiling import PHASES, PREFIX

__all__ = ['PHASES', 'timed_phases', 'phase_times']


def _phase_name(event) -> str:
    name = event.name
    return name[len(PREFIX):] if name.startswith(PREFIX) else ''


def _labelled_time(event) -> float:
    """Microseconds of the nearest labelled events under ``event``."""
    total = 0.0
    for child in event.cpu_children:
        if _phase_name(child) in PHASES:
            total += child.cpu_time_total
        else:
            total += _labelled_time(child)
    return total


def phase_times(events: Iterable) -> Dict[str, float]:
    """Exclusive seconds per phase description (:data:`PHASES`) of the
    ``kcla::`` labels among a profiler's ``events()``."""
    totals: Dict[str, float] = defaultdict(float)
    for event in events:
        name = _phase_name(event)
        if name in PHASES:
            exclusive = event.cpu_time_total - _labelled_time(event)
            totals[PHASES[name]] += exclusive * 1e-6
    return totals


@contextmanager
def timed_phases() -> Iterator[Dict[str, float]]:
    """Profiles the block (CPU); when it ends, the yielded dict holds the
    exclusive seconds of each KCLA phase that ran in it, by its
    description in :data:`PHASES`."""
    totals: Dict[str, float] = {}
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        yield totals
    totals.update(phase_times(prof.events()))
