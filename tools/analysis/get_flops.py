"""Parameters and FLOPs of a kcla_mm (mmdet, mmseg or mmpretrain) config.

    python tools/analysis/get_flops.py CONFIG [--shape H W] [--backbone-only]
        [--cfg-options KEY=VALUE ...] [--show-table]

Counts with mmengine's ``mmengine.analysis`` (fvcore's jit-trace counter):
one multiply-add counts as one FLOP, as in mmdet's and mmseg's get_flops
tools (so the figures are MACs). The model runs in eval mode on one
1x3xHxW zero image, detectors in mmdet's ``mode='tensor'`` (backbone, neck,
RPN, RoI heads, without NMS post-processing) and segmentors in mmseg's.

mmengine has no counting rule for the ops that carry the layer attention
(KCLA's state update ``aten::baddbmm`` / ``aten::addcmul_``, LA's softmax,
the gates' sigmoid, KCLA's exp): the count adds
``kcla_mm.analysis.complexity.ATTENTION_OP_HANDLES``, the rules that
tools/analysis/depth_scaling.py counts with too. Every op that still has no
rule is listed under "uncounted ops" with how often it ran (elementwise
adds, norms of the pooled keys), so nothing is dropped silently. The
counting itself is :func:`kcla_mm.analysis.flops.analyse_config`.
"""
import argparse

from mmengine.analysis.print_helper import _format_size, complexity_stats_table
from mmengine.config import Config, DictAction

from kcla_mm.analysis.flops import analyse_config


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description='Parameters and FLOPs of a config')
    parser.add_argument('config', help='config file path')
    parser.add_argument(
        '--shape',
        type=int,
        nargs=2,
        default=None,
        metavar=('H', 'W'),
        help='input image size (default: 1280 800 for mmdet configs, the '
        "config's crop_size for mmseg configs)")
    parser.add_argument(
        '--backbone-only',
        action='store_true',
        help='count only model.backbone')
    parser.add_argument(
        '--show-table', action='store_true', help='print the per-module table')
    parser.add_argument(
        '--cfg-options',
        nargs='+',
        action=DictAction,
        help='override config settings, KEY=VALUE')
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    cfg = Config.fromfile(args.config)
    if args.cfg_options:
        cfg.merge_from_dict(args.cfg_options)
    height, width = args.shape or (None, None)
    result = analyse_config(cfg, height, width, args.backbone_only)
    height, width = result['shape']
    part = 'backbone of ' if args.backbone_only else ''
    split = '=' * 30
    print(f'{split}\nConfig: {part}{args.config}\n'
          f'Input shape: (1, 3, {height}, {width})\n'
          f"Params: {_format_size(result['params'])} "
          f"({result['params']:,})\n"
          f"Flops: {_format_size(result['flops'])} ({result['flops']:,}; "
          'one multiply-add = 1 FLOP)\n'
          f"Activations: {_format_size(result['activations'])}\n{split}")
    by_operator = result['flop_analyzer'].by_operator()
    print('Flops by operator: ' +
          ', '.join(f'{op} {n:,}' for op, n in sorted(by_operator.items())))
    uncounted = result['uncounted']
    if uncounted:
        print('uncounted ops (no FLOP rule; mostly elementwise): ' +
              ', '.join(f'{op} x{n}' for op, n in sorted(uncounted.items())))
    if args.show_table:
        print(
            complexity_stats_table(
                flops=result['flop_analyzer'],
                activations=result['activation_analyzer'],
                show_param_shapes=True))


if __name__ == '__main__':
    main()
