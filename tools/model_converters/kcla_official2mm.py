"""Convert an official KCLA checkpoint (github bgx666/KCLA) for kcla_mm.

    python tools/model_converters/kcla_official2mm.py [--with-head] SRC DST

SRC is a checkpoint of the official ImageNet model
(``imagenet/kcla_resnet.py``, R50/R101) or of the official CIFAR model
(``cifar/models/cifar/KCLA.py``, e.g. R56), ``module.``-prefixed or not.

Without ``--with-head``, DST is a backbone checkpoint: it loads with
``KCLAResNet(depth=...)`` (ImageNet) or ``KCLAResNetCIFAR(depth=...,
block=...)`` (CIFAR) and ``init_cfg=dict(type='Pretrained',
checkpoint=DST)`` with no missing and no unexpected keys; this is what the
detection and segmentation configs start from. With ``--with-head``, DST is
a checkpoint of the matching mmpretrain classifier config (printed, e.g.
``configs/kcla/kcla-r50_8xb32_in1k.py``): ``backbone.*`` and ``head.fc.*``,
for ``tools/test.py CONFIG DST``. The official keys that have no
counterpart (modules the official forward never uses, and the classifier
``fc.*`` without ``--with-head``) are listed, not silently lost.
"""
import argparse
import sys

import torch

from kcla_mm.models.official_checkpoint import (OfficialCheckpointError,
                                                convert_official_checkpoint)
from kcla_mm.utils.cli import make_parent_dir


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description='Convert an official KCLA checkpoint (ImageNet or CIFAR '
        'model) to a kcla_mm backbone or classifier checkpoint')
    parser.add_argument('src', help='official checkpoint (.pth/.pth.tar)')
    parser.add_argument('dst', help='output checkpoint (.pth)')
    parser.add_argument(
        '--with-head',
        action='store_true',
        help='keep the classifier: write the checkpoint of the matching '
        'mmpretrain classifier config (backbone.* and head.fc.*)')
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        result = convert_official_checkpoint(args.src, args.with_head)
    except OfficialCheckpointError as exc:
        print(f'error: {exc}', file=sys.stderr)
        return 1
    make_parent_dir(args.dst)
    torch.save(dict(state_dict=result.state_dict, meta=result.meta), args.dst)
    model = f'{result.backbone}-{result.depth}'
    if result.layout == 'cifar':
        model += f' ({result.block})'
    what = 'classifier' if args.with_head else 'backbone'
    print(f'converted {len(result.state_dict)} tensors of the official '
          f'{result.layout} model into a {model} {what} checkpoint: '
          f'{args.dst}')
    if args.with_head:
        if result.meta['config']:
            print(f"its config: {result.meta['config']}")
        else:
            print(f'no config of kcla_mm has this depth and '
                  f'{result.num_classes} classes: start from the closest one '
                  'and set model.backbone.depth and model.head.num_classes')
    print(f'dropped {len(result.dropped)} official keys with no '
          f'counterpart in the {what}:')
    for key, reason in result.dropped.items():
        print(f'  {key}  ({reason})')
    return 0


if __name__ == '__main__':
    sys.exit(main())
