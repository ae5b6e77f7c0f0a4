"""Parameters and FLOPs of a kcla_mm (mmdet or mmseg) config.

    python tools/analysis/get_flops.py CONFIG [--shape H W] [--backbone-only]
        [--cfg-options KEY=VALUE ...] [--show-table]

Counts with mmengine's ``mmengine.analysis`` (fvcore's jit-trace counter):
one multiply-add counts as one FLOP, as in mmdet's and mmseg's get_flops
tools (so the figures are MACs). The model runs in eval mode on one
1x3xHxW zero image, detectors in mmdet's ``mode='tensor'`` (backbone, neck,
RPN, RoI heads, without NMS post-processing) and segmentors in mmseg's.

mmengine has no counting rule for the ops that carry the layer attention
(KCLA's state update ``aten::baddbmm`` / ``aten::addcmul_``, LA's softmax,
the gates' sigmoid, KCLA's exp): this tool adds
``kcla_mm.analysis.complexity.ATTENTION_OP_HANDLES``, the rules that
tools/analysis/depth_scaling.py counts with too. Every op that still has no
rule is listed under "uncounted ops" with how often it ran (elementwise
adds, norms of the pooled keys), so nothing is dropped silently.
"""
import argparse
import os.path as osp
import sys
from functools import partial

import torch
from mmengine.analysis import ActivationAnalyzer, FlopAnalyzer, parameter_count
from mmengine.analysis.print_helper import _format_size, complexity_stats_table
from mmengine.config import Config, DictAction
from mmengine.registry import MODELS, init_default_scope

sys.path.insert(0, osp.join(osp.dirname(osp.abspath(__file__)), '..', '..'))

import kcla_mm  # noqa: E402,F401  registers KCLA modules in mmdet and mmseg
from kcla_mm.analysis.complexity import ATTENTION_OP_HANDLES  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description='Parameters and FLOPs of a config')
    parser.add_argument('config', help='config file path')
    parser.add_argument(
        '--shape', type=int, nargs=2, default=None, metavar=('H', 'W'),
        help='input image size (default: 1280 800 for mmdet configs, the '
        "config's crop_size for mmseg configs)")
    parser.add_argument(
        '--backbone-only', action='store_true',
        help='count only model.backbone')
    parser.add_argument(
        '--show-table', action='store_true',
        help='print the per-module table')
    parser.add_argument(
        '--cfg-options', nargs='+', action=DictAction,
        help='override config settings, KEY=VALUE')
    return parser.parse_args(argv)


def default_shape(cfg: Config, scope: str):
    """mmdet's get_flops default (1280, 800) for detectors; the crop size
    the segmentor is trained on for segmentors."""
    if scope == 'mmseg':
        size = (cfg.get('crop_size')
                or cfg.model.get('data_preprocessor', {}).get('size'))
        if size:
            return int(size[0]), int(size[1])
    return 1280, 800


def build_model(cfg: Config, backbone_only: bool):
    model = MODELS.build(cfg.model)
    if backbone_only:
        model = model.backbone
    model.eval()
    return model


def data_samples(scope: str, height: int, width: int):
    """One data sample with the meta information the heads read."""
    meta = dict(img_shape=(height, width), ori_shape=(height, width),
                pad_shape=(height, width), batch_input_shape=(height, width),
                scale_factor=(1.0, 1.0))
    if scope == 'mmdet':
        from mmdet.structures import DetDataSample
        return [DetDataSample(metainfo=meta)]
    from mmseg.structures import SegDataSample
    return [SegDataSample(metainfo=meta)]


def analyse(cfg: Config, height: int, width: int,
            backbone_only: bool = False) -> dict:
    """Parameters, FLOPs and activations of ``cfg``'s model on one
    ``1x3xHxW`` image.

    Returns:
        dict: ``params``, ``flops``, ``activations`` (ints),
        ``uncounted`` (op name -> number of calls without a FLOP rule) and
        the analyzers (``flop_analyzer``, ``activation_analyzer``).
    """
    scope = cfg.get('default_scope', 'mmdet')
    init_default_scope(scope)
    model = build_model(cfg, backbone_only)
    image = torch.zeros(1, 3, height, width)
    if backbone_only:
        target, inputs = model, (image, )
    else:
        # Detectors and segmentors take data samples besides the image: bind
        # them so that the traced forward sees one tensor argument.
        model.forward = partial(
            model.forward, data_samples=data_samples(scope, height, width),
            mode='tensor')
        target, inputs = model, (image, )
    with torch.no_grad():
        flops = FlopAnalyzer(target, inputs)
        flops.set_op_handle(**ATTENTION_OP_HANDLES)
        flops.unsupported_ops_warnings(False)
        flops.uncalled_modules_warnings(False)
        activations = ActivationAnalyzer(target, inputs)
        activations.unsupported_ops_warnings(False)
        activations.uncalled_modules_warnings(False)
        total_flops = flops.total()
        total_acts = activations.total()
    return dict(
        params=parameter_count(model)[''], flops=total_flops,
        activations=total_acts, uncounted=dict(flops.unsupported_ops()),
        flop_analyzer=flops, activation_analyzer=activations)


def main(argv=None):
    args = parse_args(argv)
    cfg = Config.fromfile(args.config)
    if args.cfg_options:
        cfg.merge_from_dict(args.cfg_options)
    scope = cfg.get('default_scope', 'mmdet')
    if scope not in ('mmdet', 'mmseg'):
        raise ValueError(f"{args.config}: default_scope is {scope!r}; "
                         "expected 'mmdet' or 'mmseg'")
    height, width = args.shape or default_shape(cfg, scope)
    result = analyse(cfg, height, width, args.backbone_only)
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
    print('Flops by operator: ' + ', '.join(
        f'{op} {n:,}' for op, n in sorted(by_operator.items())))
    uncounted = result['uncounted']
    if uncounted:
        print('uncounted ops (no FLOP rule; mostly elementwise): ' + ', '.join(
            f'{op} x{n}' for op, n in sorted(uncounted.items())))
    if args.show_table:
        print(complexity_stats_table(
            flops=result['flop_analyzer'],
            activations=result['activation_analyzer'],
            show_param_shapes=True))


if __name__ == '__main__':
    main()
