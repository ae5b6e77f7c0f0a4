"""Benchmark KCLAResNet against mmdet's ResNet of the same depth.

Both models are measured in one run, alternating iteration by iteration so
that machine noise hits both alike; the script prints medians and their
ratios. It asserts nothing: speed is a measurement, not a test. The models and
the measurements are :mod:`kcla_mm.analysis.benchmark`'s.

    python tools/analysis/benchmark_backbone.py --depth 50 --threads 1

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
import statistics
import sys

import torch
from mmengine.logging import MMLogger

from kcla_mm.analysis.benchmark import (TRAIN_SETTINGS, build_models,
                                        time_modes, train_step_memory)
from kcla_mm.models.layers.kcla import IMPLEMENTATIONS


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--depth', type=int, default=50)
    parser.add_argument(
        '--threads',
        type=int,
        default=1,
        help='torch intra-op threads (default 1)')
    parser.add_argument('--eval-batch', type=int, default=1)
    parser.add_argument('--train-batch', type=int, default=8)
    parser.add_argument('--size', type=int, default=224)
    parser.add_argument(
        '--repeats',
        type=int,
        default=15,
        help='timed iterations per model and mode')
    parser.add_argument('--warmup', type=int, default=3)
    parser.add_argument('--device', default='cpu')
    parser.add_argument(
        '--keep-freed-memory',
        action='store_true',
        help='re-run with MALLOC_MMAP_THRESHOLD_/MALLOC_TRIM_THRESHOLD_ '
        'raised (see the module docstring)')
    parser.add_argument(
        '--channels-last',
        action='store_true',
        help='run both models and inputs in channels_last (NHWC), where '
        "oneDNN's depthwise conv needs no layout reorders")
    parser.add_argument(
        '--kcla-implementation',
        default='auto',
        choices=list(IMPLEMENTATIONS),
        help="KCLAResNet(kcla_implementation=...): 'auto' (the default) "
        "runs the compiled kernels where built, 'fused' and 'recompute' are "
        'the pure-PyTorch paths')
    parser.add_argument(
        '--official',
        metavar='FILE',
        help='also measure the official model: your copy of '
        'imagenet/kcla_resnet.py of github bgx666/KCLA (fc removed), in the '
        "same interleaved run and in the memory of the 'bn' setting")
    parser.add_argument(
        '--modes',
        nargs='+',
        default=['eval', 'train'],
        choices=['eval', 'train'])
    return parser.parse_args()


# Values glibc reads only at process start, hence the re-run. 32 MiB is the
# largest mmap threshold glibc accepts on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX);
# a larger value is silently ignored and every allocation above 128 KiB is
# mapped again.
KEEP_FREED_MEMORY_ENV = {
    'MALLOC_MMAP_THRESHOLD_': str(32 * 2**20),
    'MALLOC_TRIM_THRESHOLD_': str(2**32),
}


def main():
    args = parse_args()
    if args.keep_freed_memory and any(
            os.environ.get(k) != v for k, v in KEEP_FREED_MEMORY_ENV.items()):
        os.execve(sys.executable, [sys.executable] + sys.argv, {
            **os.environ,
            **KEEP_FREED_MEMORY_ENV
        })
    torch.set_num_threads(args.threads)
    # init_weights() logs one INFO record per parameter.
    MMLogger.get_current_instance().setLevel(logging.WARNING)
    memory_format = (
        torch.channels_last if args.channels_last else torch.contiguous_format)
    models = build_models(
        args.depth,
        args.device,
        memory_format,
        args.kcla_implementation,
        official=args.official)
    x_eval = torch.randn(
        args.eval_batch, 3, args.size, args.size,
        device=args.device).contiguous(memory_format=memory_format)
    x_train = torch.randn(
        args.train_batch, 3, args.size, args.size,
        device=args.device).contiguous(memory_format=memory_format)
    results = time_modes(models, x_eval, x_train, args.modes, args.warmup,
                         args.repeats, args.device)

    print(f'KCLAResNet-{args.depth} vs ResNet-{args.depth} on {args.device}, '
          f'{args.threads} thread(s), torch {torch.__version__}, ' +
          ('channels_last, ' if args.channels_last else 'NCHW, ') +
          f'kcla_implementation={args.kcla_implementation}, malloc ' +
          ('keeping freed memory' if args.keep_freed_memory else 'defaults'))
    for mode, batch in (('eval', args.eval_batch), ('train',
                                                    args.train_batch)):
        if mode not in args.modes:
            continue
        base = statistics.median(results[('resnet', mode)])
        kcla = statistics.median(results[('kcla', mode)])
        label = 'eval forward' if mode == 'eval' else 'train step (fwd+bwd)'
        line = (f'{label:22s} batch {batch:2d}x3x{args.size}x{args.size}: '
                f'ResNet {base * 1e3:8.1f} ms  KCLA {kcla * 1e3:8.1f} ms  '
                f'ratio {kcla / base:.3f}')
        if 'official' in models:
            official = statistics.median(results[('official', mode)])
            line += (f'  official {official * 1e3:8.1f} ms  ratio '
                     f'{official / base:.3f}')
        print(line)

    if 'train' not in args.modes:
        return
    for setting in TRAIN_SETTINGS:
        if setting != 'bn':
            models = build_models(args.depth, args.device, memory_format,
                                  args.kcla_implementation, setting)
        memory = train_step_memory(models, x_train, args.device)
        line = (f'activation memory of a train step ({setting}, weights '
                f'excluded): ResNet {memory["resnet"] / 2**20:.1f} MiB  KCLA '
                f'{memory["kcla"] / 2**20:.1f} MiB  ratio '
                f'{memory["kcla"] / memory["resnet"]:.3f}')
        if 'official' in memory:
            line += (f'  official {memory["official"] / 2**20:.1f} MiB  '
                     f'ratio {memory["official"] / memory["resnet"]:.3f}')
        print(line)
        if args.device.startswith('cuda'):
            print(f'peak CUDA memory of a train step ({setting}): ResNet '
                  f'{memory["resnet_peak"] / 2**20:.1f} MiB  KCLA '
                  f'{memory["kcla_peak"] / 2**20:.1f} MiB  ratio '
                  f'{memory["kcla_peak"] / memory["resnet_peak"]:.3f}')


if __name__ == '__main__':
    main()
