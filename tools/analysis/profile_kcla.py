"""Per-phase time of the KCLA layers inside a KCLAResNet eval forward and
train step, beside mmdet's ResNet of the same depth.

    python tools/analysis/profile_kcla.py --depth 50 --threads 1

The two models alternate as in benchmark_backbone.py (same settings:
``--setting imagenet``, the default, is an eval forward of 1x3x224x224 and
a train step of 8x3x224x224; ``--setting detection`` 1x3x800x1216 and
2x3x512x512 with ``frozen_stages=1, norm_eval=True``); each KCLA step is
run once more under torch.profiler, which times its layers' ``kcla::``
phase labels (:mod:`kcla_mm.analysis.phase_profile`). Printed per mode:
the median step times, and each phase's mean milliseconds per step
and share of ResNet's step. "not in a phase" is the KCLA step's median
minus ResNet's minus the phases: the autograd engine's work on the pooled
vectors, the layers' Python, page faults outside the phases (a phase's own
count in its time), and noise. Each model's median minor page faults and
system CPU time per timed step are printed beside it (getrusage, the whole
process), since a step's fresh tensors cost page faults at any thread
count; for the train step also the faults of its backward pass alone.
It asserts nothing.
"""
import argparse
import logging
import statistics
import time
from functools import partial

try:
    import resource
except ImportError:  # not on Windows
    resource = None

import torch
from mmengine.logging import MMLogger

from kcla_mm.analysis.benchmark import (DEPTHS, SETTINGS, build_models,
                                        setting_shapes)
from kcla_mm.analysis.phase_profile import timed_phases
from kcla_mm.analysis.timing import eval_step, train_step
from kcla_mm.models.layers.kcla.compiled import extension
from kcla_mm.utils.cli import int_at_least


def parse_args(argv=None):
    # The docstring's first sentence, which spans two lines.
    parser = argparse.ArgumentParser(
        description=' '.join(__doc__.split('\n\n')[0].split()))
    parser.add_argument('--depth', type=int, default=50, choices=DEPTHS)
    parser.add_argument(
        '--threads',
        type=int_at_least('--threads', 0),
        default=1,
        help="torch intra-op threads; 0 is torch's default (all cores)")
    parser.add_argument(
        '--setting',
        choices=sorted(SETTINGS),
        default='imagenet',
        help="benchmark_backbone.py's input sizes and backbone arguments")
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
        '--repeats', type=int_at_least('--repeats', 1), default=5)
    parser.add_argument(
        '--warmup', type=int_at_least('--warmup', 0), default=2)
    parser.add_argument(
        '--kcla-implementation',
        choices=('auto', 'compiled', 'fused'),
        default='auto',
        help="the layer's implementation; 'auto' profiles the compiled "
        "kernels where they are built, else 'fused'")
    parser.add_argument(
        '--modes',
        nargs='+',
        choices=('eval', 'train'),
        default=['eval', 'train'])
    return parser.parse_args(argv)


def _usage():
    """(minor page faults, system CPU seconds) of the process so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_minflt, usage.ru_stime


def profile_mode(models, step, warmup, repeats, marks=None):
    """(ResNet seconds, KCLA seconds, {phase: seconds per step}, {model:
    (median minor page faults, median system CPU seconds, median faults
    of the backward pass or None) per step}, the latter empty where
    getrusage is missing). ``marks``, where given, is the list to which
    ``step`` appends :func:`_usage` between its forward and backward
    pass."""
    for _ in range(warmup):
        for model in models.values():
            step(model)
    times = {name: [] for name in models}
    usages = {name: [] for name in models}
    phases = {}

    def timed(name):
        if marks is not None:
            marks.clear()
        before = _usage() if resource is not None else None
        start = time.perf_counter()
        step(models[name])
        times[name].append(time.perf_counter() - start)
        if before is not None:
            after = _usage()
            backward = after[0] - marks[-1][0] if marks else None
            usages[name].append(
                (after[0] - before[0], after[1] - before[1], backward))

    for _ in range(repeats):
        timed('resnet')
        timed('kcla')
        # The profiler slows the step: its phases are timed in another run.
        with timed_phases() as totals:
            step(models['kcla'])
        for label, seconds in totals.items():
            phases[label] = phases.get(label, 0.0) + seconds / repeats
    faults = {}
    for name, usage in usages.items():
        if usage:
            counts, seconds, backward = zip(*usage)
            backward = (None
                        if None in backward else statistics.median(backward))
            faults[name] = (statistics.median(counts),
                            statistics.median(seconds), backward)
    return (statistics.median(times['resnet']),
            statistics.median(times['kcla']), phases, faults)


def fault_summary(faults, name: str, label: str) -> str:
    """``label``'s entry of the page-fault line."""
    count, seconds, backward = faults[name]
    summary = f'{label} {count:.0f} ({seconds * 1e3:.1f} ms system CPU'
    if backward is not None:
        summary += f', {backward:.0f} in backward'
    return summary + ')'


def main(argv=None):
    args = parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    # init_weights logs every parameter
    MMLogger.get_current_instance().setLevel(logging.WARNING)
    implementation = args.kcla_implementation
    if implementation == 'auto':
        implementation = 'compiled' if extension() is not None else 'fused'
    models = build_models(
        args.depth,
        kcla_implementation=args.kcla_implementation,
        setting=args.setting)
    eval_shape, train_shape = setting_shapes(args.setting, args.eval_batch,
                                             args.train_batch, args.size)
    inputs = {
        'eval': torch.randn(*eval_shape),
        'train': torch.randn(*train_shape)
    }
    # getrusage readings between a train step's forward and backward pass
    marks = []
    between = None if resource is None else lambda: marks.append(_usage())
    steps = {'eval': eval_step, 'train': partial(train_step, between=between)}
    print(f'KCLAResNet-{args.depth} (kcla_implementation='
          f'{args.kcla_implementation}: {implementation} phases) vs '
          f'ResNet-{args.depth}, {args.setting} setting, cpu, '
          f'{torch.get_num_threads()} thread(s), torch {torch.__version__}')
    for mode in ('eval', 'train'):
        if mode not in args.modes:
            continue
        x = inputs[mode]
        base, kcla, phases, faults = profile_mode(models, steps[mode](x),
                                                  args.warmup, args.repeats,
                                                  marks)
        shape = 'x'.join(map(str, x.shape))
        print(f'\n{mode} ({shape}, median of {args.repeats}): ResNet '
              f'{base * 1e3:.1f} ms, KCLA {kcla * 1e3:.1f} ms, ratio '
              f'{kcla / base:.3f}')
        print(f'  {"phase":<56} {"ms/step":>8} {"% of ResNet":>12}')
        for label, seconds in sorted(phases.items(), key=lambda p: -p[1]):
            print(f'  {label:<56} {seconds * 1e3:8.1f} '
                  f'{100 * seconds / base:11.1f}%')
        rest = kcla - base - sum(phases.values())
        label = 'not in a phase (autograd, Python, page faults, noise)'
        print(f'  {label:<56} {rest * 1e3:8.1f} {100 * rest / base:11.1f}%')
        if faults:
            print('  minor page faults per step (median): ' + ', '.join(
                fault_summary(faults, name, label)
                for name, label in (('resnet', 'ResNet'), ('kcla', 'KCLA'))))


if __name__ == '__main__':
    main()
