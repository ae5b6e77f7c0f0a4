"""Convert an official KCLA ImageNet checkpoint (github bgx666/KCLA) into a
KCLAResNet backbone checkpoint for mmdet/mmseg.

    python tools/model_converters/kcla_official2mm.py SRC DST

DST loads with ``KCLAResNet(depth=..., init_cfg=dict(type='Pretrained',
checkpoint=DST))`` with no missing and no unexpected keys. The official keys
that have no counterpart (the classifier ``fc.*`` and modules the official
forward never uses) are listed, not silently lost.
"""
import argparse
import sys

import torch

from kcla_mm.models.official_checkpoint import (OfficialCheckpointError,
                                                convert_official_checkpoint)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description='Convert an official KCLA ImageNet checkpoint to a '
        'KCLAResNet backbone checkpoint')
    parser.add_argument('src', help='official checkpoint (.pth/.pth.tar)')
    parser.add_argument('dst', help='output backbone checkpoint (.pth)')
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        result = convert_official_checkpoint(args.src)
    except OfficialCheckpointError as exc:
        print(f'error: {exc}', file=sys.stderr)
        return 1
    torch.save(dict(state_dict=result.state_dict, meta=result.meta), args.dst)
    print(f'converted {len(result.state_dict)} tensors of KCLAResNet-'
          f'{result.depth} from {args.src} to {args.dst}')
    print(f'dropped {len(result.dropped)} official keys with no '
          'counterpart in the backbone:')
    for key, reason in result.dropped.items():
        print(f'  {key}  ({reason})')
    return 0


if __name__ == '__main__':
    sys.exit(main())
