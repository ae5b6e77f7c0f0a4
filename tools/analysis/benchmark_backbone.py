"""Benchmark KCLAResNet against mmdet's ResNet of the same depth.

For each depth, setting and thread count (a section of the output) the
models run in one process, alternating iteration by iteration so that
machine noise hits them alike; the script prints ResNet's medians and each
other model's ratio to them, and under each timing row (with two or more
``--repeats``) the middle half of the rounds' own ratios, each round's step
against ResNet's of the same round: how far the ratio moves within the
run. It asserts nothing: speed is a measurement, not a test. The models
and the measurements are :mod:`kcla_mm.analysis.benchmark`'s.

A run's ratio moves between runs more than between its rounds (on a
shared VM, by a few percent: memory layout, the stretch of noise it
meets). ``--runs N`` times each section N times, each run in a fresh
process, and prints the median of the runs' ratios with the lowest and
highest run's beneath it.

    python tools/analysis/benchmark_backbone.py --depth 50 --threads 1 0 \
        --setting imagenet detection --implementations auto fused

Settings (``--setting``): 'imagenet' times an eval forward of 1x3x224x224
and a train step of 8x3x224x224 with every BN training; 'detection' an eval
forward of 1x3x800x1216 and a train step of 2x3x512x512 with
``frozen_stages=1, norm_eval=True`` (mmdet's Faster R-CNN backbone).
``--eval-batch``, ``--train-batch`` and ``--size`` override those sizes.

Memory rows (with the train mode): the activation memory of a train step
(the bytes autograd saves for backward, weights excluded); the peak tensor
memory of the step (the high-water mark of the bytes held by tensors above
their level before the step: activations, temporaries and the weights'
gradients; ``torch.cuda.max_memory_allocated`` on CUDA); and on the CPU
the peak RSS growth of the step (the resident set's high-water mark above
its level before the step: the tensors' peak and what glibc's malloc keeps
of freed memory). Each model is measured in a fresh process (see
:mod:`kcla_mm.analysis.benchmark`), ``--memory-repeats`` times (3 by
default), the models alternating: the rows show the medians, since one
process's RSS growth moves by some percent.

``--process-per-model`` times each model in a fresh process of its own,
the rounds still alternating between the processes. Models in one process
share glibc's heap, so that what one step frees the other's reuses or
finds returned to the OS: which of the two then pays the page faults of
growing it again depends on the pair (docs/benchmarks.md, "Models sharing
a process"). A user's process holds one model, as a process of its own
does; but each process also brings its own memory layout, which moved the
eval ratios between runs far more on this project's VM, hence one process
by default.

``--keep-freed-memory`` re-runs the script with glibc's malloc told to keep
freed blocks instead of returning them to the OS (mmap threshold at its
32 MiB maximum, trim threshold 4 GiB): by default large tensors are mapped
and unmapped, or the heap trimmed, per allocation, and on this project's VM
the page faults of touching fresh pages cost more than most ops that fill
them (allocating an 8x256x56x56 sum: 15 ms by default, 3.6 ms so; an
in-place add of the same size: 2 ms). It is the effect that jemalloc and
tcmalloc remove in Intel's CPU tuning guides; it helps both models.
"""
import argparse
import logging
import os
import os.path as osp
import statistics
import sys

import torch
from mmengine.logging import MMLogger

from kcla_mm.analysis.benchmark import (DEPTHS, SETTINGS, median_memory,
                                        official_file_problem,
                                        official_has_setting,
                                        round_ratio_quartiles, run_ratio_range,
                                        setting_shapes, time_runs,
                                        train_step_memory_in_subprocess)
from kcla_mm.models.layers.kcla import IMPLEMENTATIONS
from kcla_mm.models.layers.kcla.compiled import NO_EXTENSION_ENV, extension
from kcla_mm.utils.cli import int_at_least

# torch's default intra-op thread count (all cores), what --threads 0 means.
DEFAULT_THREADS = torch.get_num_threads()


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument(
        '--depth',
        type=int,
        nargs='+',
        default=[50],
        choices=DEPTHS,
        help='ResNet depth(s), one section each')
    parser.add_argument(
        '--threads',
        type=int_at_least('--threads', 0),
        nargs='+',
        default=[1],
        help='torch intra-op thread count(s), one section each; 0 is '
        "torch's default (all cores)")
    parser.add_argument(
        '--setting',
        '--settings',
        dest='settings',
        nargs='+',
        default=['imagenet'],
        choices=list(SETTINGS),
        help="input sizes and train arguments, one section each: 'imagenet' "
        '(eval 1x3x224x224, train 8x3x224x224, BN training), '
        "'detection' (eval 1x3x800x1216, train 2x3x512x512, "
        'frozen_stages=1, norm_eval=True)')
    parser.add_argument(
        '--implementations',
        '--kcla-implementation',
        dest='implementations',
        nargs='+',
        default=['auto'],
        choices=list(IMPLEMENTATIONS) +
        ['auto+keep-outputs', 'compiled+keep-outputs'],
        help="KCLAResNet(kcla_implementation=...), one column each: 'auto' "
        "runs the compiled kernels where built, 'fused' and 'recompute' are "
        "the pure-PyTorch paths; '+keep-outputs' adds "
        'kcla_recompute_outputs=False')
    parser.add_argument(
        '--official',
        metavar='FILE',
        help='also measure the official model: your copy of '
        'imagenet/kcla_resnet.py of github bgx666/KCLA (resnet50_kcla, '
        'resnet101_kcla; fc removed; --depth 50 and 101 only), in the same '
        'interleaved run; it has no frozen stages, so its train step and '
        "memory only in the 'imagenet' setting")
    parser.add_argument(
        '--eval-batch',
        type=int_at_least('--eval-batch', 1),
        help="override the setting's eval batch")
    parser.add_argument(
        '--train-batch',
        type=int_at_least('--train-batch', 1),
        help="override the setting's train batch")
    parser.add_argument(
        '--size',
        type=int_at_least('--size', 1),
        help="override the setting's input sizes with SIZE x SIZE")
    parser.add_argument(
        '--repeats',
        type=int_at_least('--repeats', 1),
        default=15,
        help='timed iterations per model and mode')
    parser.add_argument(
        '--warmup', type=int_at_least('--warmup', 0), default=3)
    parser.add_argument(
        '--runs',
        type=int_at_least('--runs', 1),
        default=1,
        help='independent timing runs per section, each in a fresh process '
        '(its own memory layout and stretch of machine noise); above 1 the '
        "tables give the median of the runs' ratios and the lowest and "
        "highest run's, instead of the middle half of one run's rounds")
    parser.add_argument(
        '--device',
        default='cpu',
        help="'cpu' or 'cuda' ('cuda:N'): the models' and inputs' device; "
        'on CUDA the peak tensor memory is torch.cuda.max_memory_allocated '
        "and the RSS row '-'")
    parser.add_argument(
        '--no-memory',
        action='store_true',
        help='leave out the memory rows (each model in a fresh process)')
    parser.add_argument(
        '--memory-repeats',
        type=int_at_least('--memory-repeats', 1),
        default=3,
        help='fresh processes per model for the memory rows, the models '
        'alternating; the rows show the medians (one process\'s peak '
        'growth moves by some percent)')
    parser.add_argument(
        '--keep-freed-memory',
        action='store_true',
        help='re-run with MALLOC_MMAP_THRESHOLD_/MALLOC_TRIM_THRESHOLD_ '
        'raised (see the module docstring)')
    parser.add_argument(
        '--process-per-model',
        action='store_true',
        help='time each model in a process of its own, the rounds still '
        'alternating between them, instead of all in one process whose '
        'heap they share (see the module docstring)')
    parser.add_argument(
        '--channels-last',
        action='store_true',
        help='run the models and inputs in channels_last (NHWC), where '
        "oneDNN's depthwise conv needs no layout reorders")
    parser.add_argument(
        '--modes',
        nargs='+',
        default=['eval', 'train'],
        choices=['eval', 'train'])
    args = parser.parse_args(argv)
    if args.official is not None:
        problem = official_file_problem(args.official, args.depth)
        if problem is not None:
            parser.error(problem)
    problem = device_problem(args.device)
    if problem is not None:
        parser.error(problem)
    compiled = [i for i in args.implementations if i.startswith('compiled')]
    if compiled and (args.channels_last or args.device != 'cpu'):
        parser.error(
            f'--implementations {compiled[0]}: the compiled kernels take '
            'NCHW CPU tensors only, not ' +
            ('--channels-last' if args.
             channels_last else f'--device {args.device}') +
            " ('auto' runs 'fused' there)")
    if compiled and extension() is None:
        parser.error(f'--implementations {compiled[0]}: the compiled kernels '
                     'are not built for this torch or are turned off '
                     f'({NO_EXTENSION_ENV}); see docs/install.md')
    return args


def device_problem(device):
    """Why ``--device device`` cannot run here, or None."""
    try:
        parsed = torch.device(device)
    except RuntimeError:
        parsed = None
    if parsed is None or parsed.type not in ('cpu', 'cuda'):
        return f"--device {device}: not 'cpu', 'cuda' or 'cuda:N'"
    if parsed.type == 'cuda':
        if not torch.cuda.is_available():
            return f'--device {device}: CUDA is not available to this torch'
        if parsed.index is not None and \
                parsed.index >= torch.cuda.device_count():
            return (f'--device {device}: this machine has '
                    f'{torch.cuda.device_count()} CUDA device(s)')
    return None


# Values glibc reads only at process start, hence the re-run. 32 MiB is the
# largest mmap threshold glibc accepts on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX);
# a larger value is silently ignored and every allocation above 128 KiB is
# mapped again.
KEEP_FREED_MEMORY_ENV = {
    'MALLOC_MMAP_THRESHOLD_': str(32 * 2**20),
    'MALLOC_TRIM_THRESHOLD_': str(2**32),
}

# The header's words on --runs, and on the rows under each timing row (by
# spread_rows).
RUNS_NOTE = (' in each of {runs} runs (fresh processes); the median of the '
             "runs' figures")
SPREAD_NOTES = {
    'rounds': (" (and the middle half of the rounds' ratios: each round's "
               "step against ResNet's of the same round)"),
    'runs': (" (and the lowest and highest run's ratio: each run's median "
             "against ResNet's of the same run)"),
    None:
    '',
}


def spread_rows(args):
    """What the row under each timing row gives: ``'runs'`` (the lowest
    and highest run's ratio, with ``--runs`` above 1), ``'rounds'`` (the
    middle half of one run's rounds' ratios, with two or more
    ``--repeats``) or None (no such row)."""
    if args.runs > 1:
        return 'runs'
    return 'rounds' if args.repeats > 1 else None


def shapes(args, setting):
    """(eval shape, train shape) of ``setting`` with the overrides."""
    return setting_shapes(setting, args.eval_batch, args.train_batch,
                          args.size)


def column_names(args, setting):
    names = [f'kcla:{impl}' for impl in args.implementations]
    return names + ['official'] if args.official else names


def heading(name):
    return 'official' if name == 'official' else 'KCLA ' + name[5:]


def format_cell(cell) -> str:
    """A ratio, a (low, high) range of ratios, or '-' for None."""
    if cell is None:
        return '-'
    if isinstance(cell, tuple):
        return f'{cell[0]:.3f}-{cell[1]:.3f}'
    return f'{cell:.3f}'


def format_table(rows, columns, base_label):
    """``rows``: (label, base value or None, unit, {column: cell}), a cell
    as :func:`format_cell` takes it."""
    label_width = max(len(r[0]) for r in rows)
    cells = [[format_cell(r[3].get(c)) for c in columns] for r in rows]
    widths = [
        max(len(heading(c)), 6, *(len(row[i]) for row in cells))
        for i, c in enumerate(columns)
    ]
    lines = [
        ' ' * label_width + f'  {base_label:>12s}  ' +
        '  '.join(f'{heading(c):>{w}s}' for c, w in zip(columns, widths))
    ]
    for (label, base, unit, _), row in zip(rows, cells):
        value = '-' if base is None else f'{base:.1f} {unit}'
        lines.append(f'{label:{label_width}s}  {value:>12s}  ' +
                     '  '.join(c.rjust(w) for c, w in zip(row, widths)))
    return '\n'.join(lines)


def run_section(args, depth, setting, threads):
    count = threads if threads > 0 else DEFAULT_THREADS
    eval_shape, train_shape = shapes(args, setting)
    timing = dict(
        depth=depth,
        setting=setting,
        eval_shape=eval_shape,
        train_shape=train_shape,
        threads=count,
        modes=args.modes,
        warmup=args.warmup,
        repeats=args.repeats,
        device=args.device,
        channels_last=args.channels_last,
        official=args.official,
        implementations=args.implementations)
    runs = time_runs(
        args.runs, process_per_model=args.process_per_model, **timing)
    columns = column_names(args, setting)
    official_trains = official_has_setting(setting)

    backbone = SETTINGS[setting]['backbone']
    print(f'\n== {setting}, ResNet-{depth}, {count} '
          f'thread(s) (--threads {threads}): eval '
          f'{"x".join(map(str, eval_shape))}, train step '
          f'{"x".join(map(str, train_shape))} with '
          f'frozen_stages={backbone["frozen_stages"]}, '
          f'norm_eval={backbone["norm_eval"]} ==')
    rows = []
    for mode, label in (('eval', 'eval forward'), ('train',
                                                   'train step (fwd+bwd)')):
        if mode not in args.modes:
            continue
        base = statistics.median(
            statistics.median(run[('resnet', mode)]) for run in runs)
        timed = [c for c in columns if (c, mode) in runs[0]]
        by_run = {c: run_ratio_range(runs, c, mode) for c in timed}
        rows.append((label, base * 1e3, 'ms', {
            c: by_run[c][0]
            for c in timed
        }))
        if spread_rows(args) == 'runs':
            rows.append((f'{mode}: lowest-highest run', None, '', {
                c: by_run[c][1]
                for c in timed
            }))
        elif spread_rows(args) == 'rounds':
            results = runs[0]
            rounds = results[('resnet', mode)]
            spreads = {
                c: round_ratio_quartiles(results[(c, mode)], rounds)
                for c in timed
            }
            rows.append((f'{mode}: 25-75% of rounds', None, '', spreads))
    if 'train' in args.modes and not args.no_memory:
        names = [
            n for n in ['resnet'] + columns
            if n != 'official' or official_trains
        ]
        samples = {name: [] for name in names}
        for _ in range(args.memory_repeats):
            for name in names:
                samples[name].append(
                    train_step_memory_in_subprocess(name, depth, setting,
                                                    train_shape, threads,
                                                    args.device,
                                                    args.channels_last,
                                                    args.official))
        memory = {name: median_memory(samples[name]) for name in names}
        for key, label in (('activation', 'activation memory'),
                           ('peak_allocated', 'peak tensor memory'),
                           ('peak_growth', 'peak RSS growth')):
            base = memory['resnet'][key]
            ratios = {
                c: memory[c][key] / base
                for c in columns
                if c in memory and base and memory[c][key] is not None
            }
            rows.append(
                (label, None if base is None else base / 2**20, 'MiB', ratios))
    print(format_table(rows, columns, f'ResNet-{depth}'))
    if args.official and not official_trains and 'train' in args.modes:
        print('(official: no frozen stages or norm_eval, so no train step '
              'in this setting)')


def main(argv=None):
    args = parse_args(argv)
    if args.keep_freed_memory and any(
            os.environ.get(k) != v for k, v in KEEP_FREED_MEMORY_ENV.items()):
        # This file with main's own arguments: sys.argv is the caller's
        # command line where main(argv) is called from other code.
        os.execve(sys.executable, [
            sys.executable,
            osp.abspath(__file__), *(sys.argv[1:] if argv is None else argv)
        ], {
            **os.environ,
            **KEEP_FREED_MEMORY_ENV
        })
    # init_weights() logs one INFO record per parameter.
    MMLogger.get_current_instance().setLevel(logging.WARNING)
    print(f'KCLAResNet vs mmdet ResNet on {args.device}, torch '
          f'{torch.__version__}, ' +
          ('channels_last, ' if args.channels_last else 'NCHW, ') + 'malloc ' +
          ('keeping freed memory' if args.keep_freed_memory else 'defaults') +
          (', each model in a process of its own' if args.
           process_per_model else '') +
          f', medians of {args.repeats} after {args.warmup} warm-up' +
          ('' if args.runs == 1 else RUNS_NOTE.format(runs=args.runs)) +
          '; ResNet: ms per eval forward / train step' +
          SPREAD_NOTES[spread_rows(args)] +
          ('' if args.no_memory or 'train' not in args.modes else
           ', MiB of activation memory (saved for backward, weights '
           'excluded) / peak tensor memory / peak RSS growth of a train '
           f'step (median of {args.memory_repeats} fresh process(es) per '
           'model)') + '; other columns: ratio to ResNet')
    for depth in args.depth:
        for setting in args.settings:
            for threads in args.threads:
                run_section(args, depth, setting, threads)


if __name__ == '__main__':
    main()
