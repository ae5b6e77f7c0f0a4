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
test: it asserts nothing. The measurement and the fit are
:mod:`kcla_mm.analysis.depth_scaling`; this tool parses, plots and prints.
"""
import argparse
import logging
import os
import os.path as osp
from typing import Dict, List

import torch
from mmengine.logging import MMLogger

from kcla_mm.analysis.depth_scaling import (METHODS, METRICS, PLANS,
                                            check_depth, measure,
                                            overhead_report, read_rows,
                                            write_rows)
from kcla_mm.torch_compat import has_mem_tracker

# Plotted also as the excess over the plain ResNet of the same depth, where
# the growth order of the attention itself shows.
OVERHEADS = (
    ('gflops', 1e3, 'FLOPs over ResNet (M)'),
    ('train_peak_mib', 1, 'train-step memory over ResNet (MiB)'),
)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        '--depths', type=int, nargs='+', default=[26, 50, 98, 146, 194])
    parser.add_argument('--plan', choices=PLANS, default='uniform')
    parser.add_argument(
        '--methods', nargs='+', choices=list(METHODS), default=list(METHODS))
    parser.add_argument('--size', type=int, default=128)
    parser.add_argument('--train-batch', type=int, default=2)
    parser.add_argument('--base-channels', type=int, default=64)
    parser.add_argument(
        '--head-dim',
        type=int,
        default=None,
        help='channels per head for all three attentions '
        '(default: each backbone\'s own, 64/64/32)')
    parser.add_argument('--repeats', type=int, default=3)
    parser.add_argument('--warmup', type=int, default=1)
    parser.add_argument('--threads', type=int, default=1)
    parser.add_argument('--out-dir', default='docs/figures')
    parser.add_argument(
        '--from-csv',
        default=None,
        help='re-plot and re-fit a depth_scaling.csv '
        'instead of measuring')
    args = parser.parse_args(argv)
    for depth in args.depths:
        try:
            check_depth(depth, args.plan)
        except ValueError as exc:
            parser.error(f'--depths: {exc}')
    if len(set(args.depths)) < 2 and 'ResNet' in args.methods:
        parser.error('--depths: give at least two depths to fit an order')
    return args


def plot(rows: List[Dict], args: argparse.Namespace, path: str) -> None:
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
            ax.plot([r['depth'] for r in mine],
                    values,
                    label=method,
                    color=f'C{index}',
                    marker='os^v'[index],
                    linestyle=('-', '--', '-', ':')[index])
        ax.set_title(label, fontsize=10)
        ax.set_xlabel(f'depth ({args.plan} Bottleneck plan)')
        ax.grid(alpha=0.3)
    axes.flat[0].legend()
    fig.suptitle(
        f'Cost versus depth, {args.size}x{args.size} input, train batch '
        f'{args.train_batch}, {args.threads} CPU thread(s), torch '
        f'{torch.__version__}',
        fontsize=11)
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
        if not has_mem_tracker():
            print(f'train-step peak memory: not measured, torch '
                  f'{torch.__version__} has no MemTracker '
                  '(torch.distributed._tools.mem_tracker)')
        rows = measure(
            args.depths,
            args.methods,
            args.plan,
            args.size,
            args.train_batch,
            args.base_channels,
            args.head_dim,
            args.warmup,
            args.repeats,
            progress=lambda line: print(line, flush=True))
    write_rows(rows, csv_path)
    png_path = osp.join(args.out_dir, 'depth_scaling.png')
    plot(rows, args, png_path)
    width = max(len(m) for m in args.methods)
    print(f'{"method":{width}s} {"depth":>5s} {"blocks":>6s} ' +
          ' '.join(f'{k:>14s}' for k, _ in METRICS))
    for r in rows:
        print(f'{r["method"]:{width}s} {r["depth"]:5d} {r["blocks"]:6d} ' +
              ' '.join(f'{r[k]:14.3f}' for k, _ in METRICS))
    for line in overhead_report(rows):
        print(line)
    print(f'wrote {csv_path} and {png_path}')


if __name__ == '__main__':
    main()
