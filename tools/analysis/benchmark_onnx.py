"""Time KCLA-ResNet against mmdet's ResNet of the same depth in onnxruntime.

Both backbones (eval, initialised weights: speed does not depend on them)
are exported with the same exporter (:func:`kcla_mm.deployment.export_onnx`,
torch's TorchScript-based one, at a fixed input shape) and run in
onnxruntime's CPUExecutionProvider, alternating iteration by iteration so
that machine noise hits them alike. Prints each model's median time and
the ratio of the medians, per input shape and thread count. Asserts
nothing: speed is a measurement, not a test.

    python tools/analysis/benchmark_onnx.py --depth 50 \
        --shapes 224x224 800x1216 --threads 1 0 --iters 10

``--threads 0`` is onnxruntime's default (one thread per physical core).
"""
import argparse
import os
import os.path as osp
import statistics
import tempfile
import time
from typing import List, Tuple

import torch

from kcla_mm.utils.cli import int_at_least


def parse_shape(text: str) -> Tuple[int, int]:
    try:
        h, w = (int(v) for v in text.lower().split('x'))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f'shape {text!r} is not HxW, e.g. 224x224') from None
    return h, w


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description='KCLA-ResNet vs ResNet in onnxruntime (same exporter)')
    parser.add_argument('--depth', type=int, default=50)
    parser.add_argument(
        '--shapes',
        type=parse_shape,
        nargs='+',
        default=[(224, 224), (800, 1216)],
        help='input H x W, batch 1 (default: 224x224 800x1216)')
    parser.add_argument(
        '--threads',
        type=int_at_least('--threads', 0),
        nargs='+',
        default=[1, 0],
        help='onnxruntime intra-op threads; 0: its default, all cores')
    parser.add_argument('--iters', type=int_at_least('--iters', 1), default=10)
    parser.add_argument(
        '--warmup', type=int_at_least('--warmup', 0), default=2)
    parser.add_argument('--opset', type=int, default=17)
    return parser.parse_args(argv)


def exportables(depth: int):
    """(name, Exportable) of ResNet and KCLA-ResNet of ``depth``."""
    from mmdet.models.backbones import ResNet

    from kcla_mm.deployment.onnx_export import (Exportable, TupleOutputs,
                                                output_names)
    from kcla_mm.models import KCLAResNet
    torch.manual_seed(0)
    out = []
    for name, cls in ((f'ResNet-{depth}', ResNet), (f'KCLA-ResNet-{depth}',
                                                    KCLAResNet)):
        model = cls(depth=depth)
        model.eval()  # mmdet's ResNet.train returns None
        out.append((name,
                    Exportable(
                        TupleOutputs(model, 'backbone').eval(), 'backbone',
                        output_names(model, 'backbone'), name)))
    return out


def time_interleaved(runs, x, iters: int, warmup: int) -> List[List[float]]:
    """Seconds per call of each of ``runs``, alternating."""
    times = [[] for _ in runs]
    for i in range(warmup + iters):
        for j, run in enumerate(runs):
            start = time.perf_counter()
            run(x)
            if i >= warmup:
                times[j].append(time.perf_counter() - start)
    return times


def main(argv=None) -> None:
    from kcla_mm.deployment import export_onnx, onnxruntime_runner
    args = parse_args(argv)
    models = exportables(args.depth)
    print(f'onnxruntime CPUExecutionProvider, {os.cpu_count()} CPUs, '
          f'torch {torch.__version__}; medians of {args.iters} interleaved '
          f'calls after {args.warmup} warm-up')
    with tempfile.TemporaryDirectory() as tmp:
        for shape in args.shapes:
            paths = []
            for name, exportable in models:
                path = osp.join(tmp, f'{name}-{shape[0]}x{shape[1]}.onnx')
                export_onnx(exportable, path, shape, opset=args.opset)
                paths.append(path)
            x = torch.rand(1, 3, *shape)
            for threads in args.threads:
                runs = [onnxruntime_runner(p, threads or None) for p in paths]
                times = time_interleaved(runs, x, args.iters, args.warmup)
                medians = [statistics.median(t) for t in times]
                label = ('all cores' if threads == 0 else
                         f'{threads} thread{"s" if threads > 1 else ""}')
                print(f'eval 1x3x{shape[0]}x{shape[1]}, {label}: '
                      f'{models[0][0]} {medians[0] * 1e3:.1f} ms, '
                      f'{models[1][0]} {medians[1] * 1e3:.1f} ms, ratio '
                      f'{medians[1] / medians[0]:.2f}')


if __name__ == '__main__':
    main()
