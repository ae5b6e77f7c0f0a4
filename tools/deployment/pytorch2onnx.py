"""Export a kcla_mm model to ONNX and check it in onnxruntime.

    python tools/deployment/pytorch2onnx.py CONFIG [CHECKPOINT] \
        --out FILE.onnx --shape H W [--batch N] [--dynamic] [--opset K] \
        [--backbone] [--verify]

Exports the backbone's feature maps (``--backbone``, any config), an
mmpretrain classifier's logits, an mmseg segmentor's ``mode='tensor'``
logits or an mmdet detector's backbone + neck features
(:mod:`kcla_mm.deployment.onnx_export`). The graph's input is the tensor
the model's data preprocessor gives (normalised). Without a checkpoint the
initialised model is exported (and the tool says so). ``--verify`` runs
the file in onnxruntime (CPU) and compares it with PyTorch on random
inputs, at the export shape and, with ``--dynamic``, at another batch size
and input size; it fails above 1e-4 of the output scale.
"""
import argparse
import sys

from kcla_mm.deployment import (DEFAULT_OPSET, DEFAULT_TOLERANCE, ExportError,
                                build_exportable, export_onnx,
                                verification_shapes, verify_onnx)
from kcla_mm.utils.cli import int_at_least


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description='Export a kcla_mm model (backbone, classifier, '
        'segmentor, detector backbone + neck) to ONNX')
    parser.add_argument('config', help='model config')
    parser.add_argument(
        'checkpoint', nargs='?', help='checkpoint (default: initialised)')
    parser.add_argument('--out', required=True, help='output .onnx file')
    parser.add_argument(
        '--shape',
        type=int_at_least('--shape', 1),
        nargs=2,
        required=True,
        metavar=('H', 'W'),
        help='input height and width')
    parser.add_argument(
        '--batch',
        type=int_at_least('--batch', 1),
        default=1,
        help='batch size')
    parser.add_argument(
        '--dynamic',
        action='store_true',
        help='dynamic batch, height and width')
    parser.add_argument(
        '--opset',
        type=int,
        default=DEFAULT_OPSET,
        help=f'ONNX opset (default {DEFAULT_OPSET})')
    parser.add_argument(
        '--backbone',
        action='store_true',
        help="export the config's backbone alone (its out_indices maps)")
    parser.add_argument(
        '--verify',
        action='store_true',
        help='compare the file in onnxruntime with PyTorch')
    parser.add_argument(
        '--tolerance',
        type=float,
        default=DEFAULT_TOLERANCE,
        help='largest max abs difference relative to the output scale')
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        exportable = build_exportable(args.config, args.checkpoint,
                                      args.backbone)
        if args.checkpoint is None:
            print('No checkpoint given: exporting the initialised model '
                  '(its weights are random, not trained)')
        records = []

        def verify(path):
            # Before the file replaces what is at --out: a graph that
            # fails is not written there.
            records.extend(
                verify_onnx(exportable, path, tuple(args.shape), args.batch,
                            args.dynamic, args.tolerance))

        export_onnx(exportable, args.out, tuple(args.shape), args.batch,
                    args.dynamic, args.opset, verify if args.verify else None)
        print(f'Exported {exportable.description} to {args.out} (opset '
              f'{args.opset}, outputs {", ".join(exportable.output_names)}'
              f'{", dynamic batch and size" if args.dynamic else ""})')
        if args.verify:
            for r in records:
                print(f'  {r.output} at {"x".join(map(str, r.input_shape))}:'
                      f' max abs diff {r.max_abs_diff:.3g} '
                      f'({r.relative:.2g} of scale {r.scale:.3g})')
            shapes = {r.input_shape for r in records}
            left_out = [
                s for s in verification_shapes(
                    tuple(args.shape), args.batch, args.dynamic)
                if s not in shapes
            ]
            print(f'Verified in onnxruntime at {len(shapes)} input '
                  f'shape(s): within {args.tolerance:g} of the output scale' +
                  ''.join(f'; not at {"x".join(map(str, s))}, which the '
                          'model refuses in PyTorch' for s in left_out))
    except ExportError as exc:
        print(f'error: {exc}', file=sys.stderr)
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main())
