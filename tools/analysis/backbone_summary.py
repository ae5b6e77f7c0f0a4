"""Build a backbone from a config and print its output shapes and size.

    python tools/analysis/backbone_summary.py \
        configs/kcla/faster-rcnn_kcla-r50_fpn_1x_coco.py

The config's ``model.backbone`` dict (or top-level ``backbone``) is built
through mmseg's registry for a config whose ``default_scope`` is mmseg,
else mmdet's (``--scope`` overrides it), exactly as the config would build
it, and initialised by its own init: the config's ``init_cfg`` (a
``Pretrained`` file that may not be on this machine) is not loaded, since
shapes and sizes do not depend on it.
"""
import argparse
import logging

import torch
from mmengine.config import Config, DictAction
from mmengine.logging import MMLogger

from kcla_mm.analysis.model_loading import backbone_config, build_backbone


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('config')
    parser.add_argument(
        '--shape',
        type=int,
        nargs=4,
        default=[1, 3, 224, 224],
        metavar=('N', 'C', 'H', 'W'))
    parser.add_argument(
        '--scope',
        choices=['mmdet', 'mmseg'],
        help="the registry to build from; default: mmseg's where the "
        "config's default_scope is mmseg, else mmdet's")
    parser.add_argument('--cfg-options', nargs='+', action=DictAction)
    return parser.parse_args()


def main():
    args = parse_args()
    cfg = Config.fromfile(args.config)
    if args.cfg_options:
        cfg.merge_from_dict(args.cfg_options)
    try:
        backbone_cfg = backbone_config(cfg)
    except ValueError as exc:
        raise SystemExit(str(exc))
    backbone_cfg = dict(backbone_cfg, init_cfg=None)
    # mmpretrain's classification configs build the same class from mmdet.
    scope = args.scope or ('mmseg'
                           if cfg.get('default_scope') == 'mmseg' else 'mmdet')
    model = build_backbone(backbone_cfg, scope)
    # init_weights() logs one INFO record per parameter.
    logger = MMLogger.get_current_instance()
    logger.setLevel(logging.WARNING)
    model.init_weights()
    model.eval()
    with torch.no_grad():
        outs = model(torch.rand(*args.shape))
    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    kcla = sum(p.numel() for n, p in model.named_parameters() if '.kcla.' in n)
    print(f'{type(model).__name__}-{backbone_cfg.get("depth")} from '
          f'{args.config}')
    print(f'input {tuple(args.shape)}')
    for i, out in zip(model.out_indices, outs):
        print(f'  stage {i + 1}: {tuple(out.shape)}')
    print(f'parameters: {total:,} ({trainable:,} trainable with the '
          f'config\'s frozen_stages; {kcla:,} in KCLA layers)')


if __name__ == '__main__':
    main()
