# Copyright (c) kcla_mm contributors. Licensed under the Apache License 2.0.
"""Cost versus depth of ResNet, KCLA, LA and MRLA-light.

For every depth, :func:`measure` builds a plain ResNet and the three
layer-attention ResNets (Bottleneck blocks) and measures parameters, FLOPs
and inference state (:mod:`.complexity`), the peak memory of a train step
(where torch has a ``MemTracker``) and alternating eval and train-step
latency (:mod:`.timing`). :func:`fit_order` and :func:`overhead_report`
fit the growth order of each method's overhead over the plain ResNet in the
number of blocks D. The rows read and write as CSV
(:func:`write_rows`, :func:`read_rows`).

Stage plans: ``'uniform'`` deepens all four stages alike, (n, n, n, n)
blocks for depth 12n + 2, so a block costs the same wherever it is added
and the growth order shows cleanly; ``'standard'`` uses the usual plans
(26: 2-2-2-2, 50, 101, 152, 200: 3-24-36-3).
"""
import csv
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Type, Union

import numpy as np
import torch
import torch.nn as nn
from mmdet.models.backbones import ResNet
from mmdet.models.backbones.resnet import Bottleneck

from ..models import KCLAResNet, LAResNet, MRLALightResNet
from ..torch_compat import has_mem_tracker
from .complexity import (count_flops, inference_state_bytes,
                         train_step_peak_bytes)
from .timing import alternating_times, eval_step, train_step

Row = Dict[str, Union[str, int, float]]

#: The compared backbones by the names the rows and plots use; this order
#: is the plots' colour order.
METHODS: Dict[str, Type[ResNet]] = {
    'ResNet': ResNet,
    'KCLA': KCLAResNet,
    'LA': LAResNet,
    'MRLA-light': MRLALightResNet
}
STANDARD_PLANS = {
    26: (2, 2, 2, 2),
    50: (3, 4, 6, 3),
    101: (3, 4, 23, 3),
    152: (3, 8, 36, 3),
    200: (3, 24, 36, 3)
}
PLANS = ('uniform', 'standard')
#: The measured columns of a row and their labels.
METRICS = (
    ('params_m', 'parameters (M)'),
    ('gflops', 'GFLOPs (eval, batch 1)'),
    ('train_peak_mib', 'train-step peak memory (MiB)'),
    ('state_mib', 'inference state memory (MiB)'),
    ('eval_ms', 'eval latency (ms)'),
    ('train_ms', 'train-step latency (ms)'),
)


def check_depth(depth: int, plan: str) -> None:
    """Raises ValueError when ``plan`` has no stage plan for ``depth``."""
    if plan not in PLANS:
        raise ValueError(f'plan {plan!r}: expected one of {PLANS}')
    if plan == 'standard' and depth not in STANDARD_PLANS:
        raise ValueError(f'depth {depth}: the standard plan has '
                         f'{sorted(STANDARD_PLANS)}')
    if plan == 'uniform' and (depth < 14 or (depth - 2) % 12):
        raise ValueError(f'depth {depth}: the uniform plan needs 12n + 2 '
                         '(26, 50, 98, 146, 194, ...)')


def stage_plan(depth: int, plan: str) -> Tuple[int, ...]:
    """Bottleneck blocks per stage of ``depth`` under ``plan``."""
    check_depth(depth, plan)
    if plan == 'standard':
        return STANDARD_PLANS[depth]
    n = (depth - 2) // 12
    return (n, n, n, n)


def build_backbone(method: str,
                   depth: int,
                   plan: str = 'uniform',
                   base_channels: int = 64,
                   head_dim: Optional[int] = None) -> nn.Module:
    """The backbone of ``method`` with this depth's Bottleneck plan,
    initialised with seed 0.

    Args:
        method (str): A key of :data:`METHODS`.
        depth (int): The depth, valid for ``plan``.
        plan (str): ``'uniform'`` or ``'standard'``.
        base_channels (int): Width of the first stage. Defaults to 64.
        head_dim (int, optional): Channels per head of the attention (not
            for ResNet); None keeps each backbone's own default.

    Returns:
        nn.Module: The initialised backbone (``norm_eval=False``, nothing
        frozen, so that a train step trains all of it).
    """
    base = METHODS[method]
    # arch_settings is a class attribute: a subclass holds the extra plan
    # without touching the registered classes.
    cls = type(
        base.__name__, (base, ),
        dict(arch_settings={
            **base.arch_settings, depth: (Bottleneck, stage_plan(depth, plan))
        }))
    kwargs = dict(
        depth=depth,
        base_channels=base_channels,
        norm_eval=False,
        frozen_stages=-1)
    if method != 'ResNet' and head_dim is not None:
        kwargs['head_dim'] = head_dim
    torch.manual_seed(0)
    model = cls(**kwargs)
    model.init_weights()
    return model


def measure(depths: Sequence[int],
            methods: Sequence[str] = tuple(METHODS),
            plan: str = 'uniform',
            size: int = 128,
            train_batch: int = 2,
            base_channels: int = 64,
            head_dim: Optional[int] = None,
            warmup: int = 1,
            repeats: int = 3,
            progress: Optional[Callable[[str], None]] = None) -> List[Row]:
    """One row per (depth, method): ``method``, ``depth``, ``blocks`` and
    the :data:`METRICS` columns.

    FLOPs and the inference state are measured at batch 1, the train-step
    peak memory at ``train_batch`` (``nan`` where torch has no
    ``MemTracker``, see :func:`kcla_mm.torch_compat.has_mem_tracker`).
    Latencies are the fastest of ``repeats`` rounds after ``warmup``, the
    methods of a depth alternating (on a shared machine the least disturbed
    run is the closest to the cost itself).

    Args:
        depths (Sequence[int]): Depths, each valid for ``plan``.
        methods (Sequence[str]): Keys of :data:`METHODS`.
        plan (str): ``'uniform'`` or ``'standard'``.
        size (int): Input height and width. Defaults to 128.
        train_batch (int): Batch of the train step. Defaults to 2.
        base_channels (int): See :func:`build_backbone`.
        head_dim (int, optional): See :func:`build_backbone`.
        warmup (int): Untimed rounds. Defaults to 1.
        repeats (int): Timed rounds. Defaults to 3.
        progress (callable, optional): Called with a line when a depth is
            done (a full run takes minutes).

    Returns:
        list[dict]: The rows, by depth, then in ``methods`` order.
    """
    for depth in depths:
        check_depth(depth, plan)
    x_eval = torch.randn(1, 3, size, size)
    x_train = torch.randn(train_batch, 3, size, size)
    with_memory = has_mem_tracker()
    rows: List[Row] = []
    for depth in depths:
        models = {
            m: build_backbone(m, depth, plan, base_channels, head_dim)
            for m in methods
        }
        for method, model in models.items():
            rows.append(
                dict(
                    method=method,
                    depth=depth,
                    blocks=sum(stage_plan(depth, plan)),
                    params_m=sum(p.numel() for p in model.parameters()) / 1e6,
                    gflops=count_flops(model, x_eval) / 1e9,
                    state_mib=inference_state_bytes(model, x_eval) / 2**20,
                    train_peak_mib=(train_step_peak_bytes(model, x_train) /
                                    2**20 if with_memory else float('nan'))))

        times = alternating_times(models, {
            'eval': eval_step(x_eval),
            'train': train_step(x_train)
        }, warmup, repeats)
        for row in rows[-len(models):]:
            for kind in ('eval', 'train'):
                row[f'{kind}_ms'] = min(times[(row['method'], kind)]) * 1e3
        if progress is not None:
            progress(f'depth {depth} done')
    return rows


def fit_order(blocks: Sequence[int],
              overhead: Sequence[float]) -> Tuple[int, float]:
    """The growth order of ``overhead`` in the number of blocks D.

    Fits overhead = a + b D + c D^2 by least squares.

    Returns:
        tuple[int, float]: ``(order, share)``, share being
        c D_max^2 / overhead(D_max). Order 0 when the overhead does not
        change with depth (within 1%), 2 when the D^2 term is at least a
        tenth of the overhead at the largest depth, else 1.
    """
    d = np.asarray(blocks, dtype=float)
    y = np.asarray(overhead, dtype=float)
    if np.ptp(y) <= 0.01 * max(abs(y).max(), 1e-12):
        return 0, 0.
    degree = min(2, len(d) - 1)
    coeffs = np.polynomial.polynomial.polyfit(d, y, degree)
    share = coeffs[2] * d.max()**2 / y[d.argmax()] if degree == 2 else 0.
    return (2 if share >= 0.1 else 1), float(share)


def overhead_report(rows: Sequence[Row]) -> List[str]:
    """One line per attention method of ``rows``: the growth order of its
    FLOPs, train memory and state memory over the plain ResNet of the same
    depth, and its inference state by depth. Nothing without ResNet rows;
    a column that was not measured (``nan``) is said so, not fitted."""
    methods = list(dict.fromkeys(r['method'] for r in rows))
    width = max(len(m) for m in methods) if methods else 0
    base = {r['depth']: r for r in rows if r['method'] == 'ResNet'}
    lines = []
    for method in methods:
        if method == 'ResNet' or not base:
            continue
        mine = [r for r in rows if r['method'] == method]
        blocks = [r['blocks'] for r in mine]
        parts = []
        for key, label in (('gflops', 'FLOPs'), ('train_peak_mib',
                                                 'train memory'),
                           ('state_mib', 'state memory')):
            over = [r[key] - base[r['depth']][key] for r in mine]
            if np.isnan(over).any():
                parts.append(f'{label} not measured')
                continue
            order, share = fit_order(blocks, over)
            name = ('constant', 'linear', 'quadratic')[order]
            parts.append(f'{label} {name} (D^2 share {share:+.2f})')
        states = ', '.join(f'{r["state_mib"]:.2f}' for r in mine)
        lines.append(f'{method:{width}s} overhead over ResNet: ' +
                     '; '.join(parts) +
                     f'. Inference state MiB by depth: {states}')
    return lines


def write_rows(rows: Sequence[Row], path: str) -> None:
    """Writes ``rows`` as CSV, floats with 4 decimals."""
    with open(path, 'w', newline='') as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        for row in rows:
            writer.writerow({
                k: f'{v:.4f}' if isinstance(v, float) else v
                for k, v in row.items()
            })


def read_rows(path: str) -> List[Row]:
    """Rows written by :func:`write_rows`, with their types back."""
    with open(path) as f:
        rows: List[Row] = list(csv.DictReader(f))
    for row in rows:
        for key, value in row.items():
            if key in ('depth', 'blocks'):
                row[key] = int(value)
            elif key != 'method':
                row[key] = float(value)
    return rows
