"""Cost versus depth of ResNet, KCLA, LA and MRLA-light, in one run.

    python tools/analysis/depth_scaling.py [--depths 26 50 98 146 194]
        [--plan uniform|standard] [--size 128] [--train-batch 2]
        [--repeats 3] [--threads 1] [--out-dir docs/figures]

For every depth it builds a plain ResNet and the three layer-attention
ResNets (Bottleneck blocks) and measures

* parameters;
* FLOPs of an eval forward at batch 1 (mmengine's ``FlopAnalyzer``, one
  multiply-accumulate = one FLOP, with handles added for the attention ops
  it would skip: baddbmm, addcmul(_), softmax, sigmoid, exp; see
  ``kcla_mm/analysis/complexity.py``);
* the largest state a block hands to the next in an eval forward at batch 1
  (KCLA: U and Z; LA: its cache; MRLA-light: O^{t-1});
* the peak memory of a train step (forward + backward, batch
  ``--train-batch``) as torch's ``MemTracker`` accounts it (where torch
  has none, e.g. torch 2.1, this column is ``nan`` and the tool says so);
* eval (batch 1) and train-step latency: the fastest of ``--repeats``
  runs (on a shared machine the least disturbed one), alternating the
  models so that machine noise hits all alike.

``--plan uniform`` deepens all four stages alike, (n, n, n, n) blocks for
depth 12n + 2, so a block costs the same wherever it is added and the growth
order shows cleanly; ``--plan standard`` uses the usual stage plans (26:
2-2-2-2, 50, 101, 152, 200: 3-24-36-3). It writes ``depth_scaling.csv`` and
``depth_scaling.png`` (one curve per method) and prints, per method, the
growth order of its overhead over the plain ResNet fitted as
a + b D + c D^2 in the number of blocks D. Latency is a measurement, not a
test: it asserts nothing.
"""
import argparse
import csv
import logging
import os
import os.path as osp
import sys
from typing import Dict, List, Sequence, Tuple

import numpy as np
import torch
from mmdet.models.backbones import ResNet
from mmdet.models.backbones.resnet import Bottleneck
from mmengine.logging import MMLogger

sys.path.insert(0, osp.join(osp.dirname(osp.abspath(__file__)), '..', '..'))

from kcla_mm.analysis.complexity import (  # noqa: E402
    count_flops, inference_state_bytes, train_step_peak_bytes)
from kcla_mm.analysis.timing import (  # noqa: E402
    alternating_times, eval_step, train_step)
from kcla_mm.models import KCLAResNet, LAResNet, MRLALightResNet  # noqa: E402
from kcla_mm.torch_compat import has_mem_tracker  # noqa: E402

METHODS = {
    'ResNet': ResNet,
    'KCLA': KCLAResNet,
    'LA': LAResNet,
    'MRLA-L': MRLALightResNet
}
STANDARD_PLANS = {
    26: (2, 2, 2, 2),
    50: (3, 4, 6, 3),
    101: (3, 4, 23, 3),
    152: (3, 8, 36, 3),
    200: (3, 24, 36, 3)
}
METRICS = (
    ('params_m', 'parameters (M)'),
    ('gflops', 'GFLOPs (eval, batch 1)'),
    ('train_peak_mib', 'train-step peak memory (MiB)'),
    ('state_mib', 'inference state memory (MiB)'),
    ('eval_ms', 'eval latency (ms)'),
    ('train_ms', 'train-step latency (ms)'),
)
# Plotted also as the excess over the plain ResNet of the same depth, where
# the growth order of the attention itself shows.
OVERHEADS = (
    ('gflops', 1e3, 'FLOPs over ResNet (M)'),
    ('train_peak_mib', 1, 'train-step memory over ResNet (MiB)'),
)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--depths', type=int, nargs='+',
                        default=[26, 50, 98, 146, 194])
    parser.add_argument('--plan', choices=['uniform', 'standard'],
                        default='uniform')
    parser.add_argument('--methods', nargs='+', choices=list(METHODS),
                        default=list(METHODS))
    parser.add_argument('--size', type=int, default=128)
    parser.add_argument('--train-batch', type=int, default=2)
    parser.add_argument('--base-channels', type=int, default=64)
    parser.add_argument('--head-dim', type=int, default=None,
                        help='channels per head for all three attentions '
                        '(default: each backbone\'s own, 64/64/32)')
    parser.add_argument('--repeats', type=int, default=3)
    parser.add_argument('--warmup', type=int, default=1)
    parser.add_argument('--threads', type=int, default=1)
    parser.add_argument('--out-dir', default='docs/figures')
    parser.add_argument('--from-csv', default=None,
                        help='re-plot and re-fit a depth_scaling.csv '
                        'instead of measuring')
    args = parser.parse_args(argv)
    for depth in args.depths:
        if args.plan == 'standard' and depth not in STANDARD_PLANS:
            parser.error(f'--depths {depth}: the standard plan has '
                         f'{sorted(STANDARD_PLANS)}')
        if args.plan == 'uniform' and (depth < 14 or (depth - 2) % 12):
            parser.error(f'--depths {depth}: the uniform plan needs '
                         '12n + 2 (26, 50, 98, 146, 194, ...)')
    if len(set(args.depths)) < 2 and 'ResNet' in args.methods:
        parser.error('--depths: give at least two depths to fit an order')
    return args


def stage_plan(depth: int, plan: str) -> Tuple[int, ...]:
    if plan == 'standard':
        return STANDARD_PLANS[depth]
    n = (depth - 2) // 12
    return (n, n, n, n)


def build(method: str, depth: int, args) -> torch.nn.Module:
    """The backbone of ``method`` with this depth's Bottleneck plan."""
    base = METHODS[method]
    # arch_settings is a class attribute: a subclass holds the extra plan
    # without touching the registered classes.
    cls = type(base.__name__, (base, ), dict(arch_settings={
        **base.arch_settings, depth: (Bottleneck, stage_plan(depth, args.plan))
    }))
    kwargs = dict(depth=depth, base_channels=args.base_channels,
                  norm_eval=False, frozen_stages=-1)
    if method != 'ResNet' and args.head_dim is not None:
        kwargs['head_dim'] = args.head_dim
    torch.manual_seed(0)
    model = cls(**kwargs)
    model.init_weights()
    return model


def measure(args) -> List[Dict]:
    x_eval = torch.randn(1, 3, args.size, args.size)
    x_train = torch.randn(args.train_batch, 3, args.size, args.size)
    with_memory = has_mem_tracker()
    if not with_memory:
        print(f'train-step peak memory: not measured, torch '
              f'{torch.__version__} has no MemTracker '
              '(torch.distributed._tools.mem_tracker)')
    rows = []
    for depth in args.depths:
        models = {m: build(m, depth, args) for m in args.methods}
        for method, model in models.items():
            rows.append(dict(
                method=method, depth=depth,
                blocks=sum(stage_plan(depth, args.plan)),
                params_m=sum(p.numel() for p in model.parameters()) / 1e6,
                gflops=count_flops(model, x_eval) / 1e9,
                state_mib=inference_state_bytes(model, x_eval) / 2**20,
                train_peak_mib=(train_step_peak_bytes(model, x_train) / 2**20
                                if with_memory else float('nan'))))

        times = alternating_times(
            models, {'eval': eval_step(x_eval), 'train': train_step(x_train)},
            args.warmup, args.repeats)
        for row in rows[-len(models):]:
            for kind in ('eval', 'train'):
                row[f'{kind}_ms'] = min(times[(row['method'], kind)]) * 1e3
        print(f'depth {depth} done', flush=True)
    return rows


def fit_order(blocks: Sequence[int], overhead: Sequence[float]):
    """Least squares overhead = a + b D + c D^2; returns (order, share):
    share is c D_max^2 / overhead(D_max). Order 0 when the overhead does
    not change with depth (within 1%), 2 when the D^2 term is at least a
    tenth of the overhead at the largest depth, else 1."""
    d = np.asarray(blocks, dtype=float)
    y = np.asarray(overhead, dtype=float)
    if np.ptp(y) <= 0.01 * max(abs(y).max(), 1e-12):
        return 0, 0.
    degree = min(2, len(d) - 1)
    coeffs = np.polynomial.polynomial.polyfit(d, y, degree)
    share = coeffs[2] * d.max()**2 / y[d.argmax()] if degree == 2 else 0.
    return (2 if share >= 0.1 else 1), float(share)


def report(rows: List[Dict], args) -> List[str]:
    lines = []
    base = {r['depth']: r for r in rows if r['method'] == 'ResNet'}
    for method in args.methods:
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
        lines.append(f'{method:7s} overhead over ResNet: ' + '; '.join(parts) +
                     f'. Inference state MiB by depth: {states}')
    return lines


def read_rows(path: str) -> List[Dict]:
    with open(path) as f:
        rows = list(csv.DictReader(f))
    for row in rows:
        for key, value in row.items():
            if key in ('depth', 'blocks'):
                row[key] = int(value)
            elif key != 'method':
                row[key] = float(value)
    return rows


def plot(rows: List[Dict], args, path: str) -> None:
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    base = {r['depth']: r for r in rows if r['method'] == 'ResNet'}
    panels = [(key, label, None) for key, label in METRICS]
    if base:
        panels[2:2] = [(key, label, scale) for key, scale, label in OVERHEADS]
    fig, axes = plt.subplots(2, 4, figsize=(17, 7.5))
    for ax, (key, label, scale) in zip(axes.flat, panels):
        for method in args.methods:
            if scale is not None and method == 'ResNet':
                continue
            mine = [r for r in rows if r['method'] == method]
            values = [r[key] for r in mine]
            if scale is not None:
                values = [(v - base[r['depth']][key]) * scale
                          for v, r in zip(values, mine)]
            # Fixed colour and marker per method in every panel (KCLA's
            # and MRLA-light's equal state curves stay both visible).
            index = list(METHODS).index(method)
            ax.plot([r['depth'] for r in mine], values, label=method,
                    color=f'C{index}', marker='os^v'[index],
                    linestyle=('-', '--', '-', ':')[index])
        ax.set_title(label, fontsize=10)
        ax.set_xlabel(f'depth ({args.plan} Bottleneck plan)')
        ax.grid(alpha=0.3)
    axes.flat[0].legend()
    fig.suptitle(
        f'Cost versus depth, {args.size}x{args.size} input, train batch '
        f'{args.train_batch}, {args.threads} CPU thread(s), torch '
        f'{torch.__version__}', fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    # init_weights() logs one INFO record per parameter.
    MMLogger.get_current_instance().setLevel(logging.WARNING)
    os.makedirs(args.out_dir, exist_ok=True)
    csv_path = osp.join(args.out_dir, 'depth_scaling.csv')
    if args.from_csv:
        rows = read_rows(args.from_csv)
        args.methods = list(dict.fromkeys(r['method'] for r in rows))
    else:
        rows = measure(args)
    with open(csv_path, 'w', newline='') as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        for row in rows:
            writer.writerow({
                k: f'{v:.4f}' if isinstance(v, float) else v
                for k, v in row.items()
            })
    png_path = osp.join(args.out_dir, 'depth_scaling.png')
    plot(rows, args, png_path)
    print(f'{"method":7s} {"depth":>5s} {"blocks":>6s} ' +
          ' '.join(f'{k:>14s}' for k, _ in METRICS))
    for r in rows:
        print(f'{r["method"]:7s} {r["depth"]:5d} {r["blocks"]:6d} ' +
              ' '.join(f'{r[k]:14.3f}' for k, _ in METRICS))
    for line in report(rows, args):
        print(line)
    print(f'wrote {csv_path} and {png_path}')


if __name__ == '__main__':
    main()
