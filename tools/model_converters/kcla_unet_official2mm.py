"""Convert an official UNet-KCLA checkpoint (github bgx666/KCLA,
``segmentation/models/UNet_kcla.py``) for kcla_mm.

    python tools/model_converters/kcla_unet_official2mm.py SRC DST

SRC is a checkpoint that the official segmentation ``train.py`` saves:
``best.pth`` (the model's state dict) or ``latest.pth`` (with
``model_state_dict``), ``module.``-prefixed or not. DST is a checkpoint of
the segmentor of ``configs/_base_/models/unet-paper_kcla-r18.py`` and the
paper configs built on it (``backbone.*``, ``decode_head.*``): it loads
with ``load_from=DST`` or ``tools/test.py CONFIG DST``. Every official key
is mapped with its shape checked, or listed as dropped (the modules the
official forward pass never uses).

The official network forgets the KCLA state in every block of a stage but
the first; kcla_mm carries it (the paper's equations). To evaluate the
official function, add ``--cfg-options model.backbone.carry_state=False``.
"""
import argparse
import sys

import torch

from kcla_mm.models.official_checkpoint import OfficialCheckpointError
from kcla_mm.models.official_unet_checkpoint import \
    convert_official_unet_checkpoint
from kcla_mm.utils.cli import make_parent_dir


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description='Convert an official UNet-KCLA checkpoint to a kcla_mm '
        'segmentor checkpoint (configs/_base_/models/unet-paper_kcla-r18.py)')
    parser.add_argument('src', help='official checkpoint (best.pth, ...)')
    parser.add_argument('dst', help='output checkpoint (.pth)')
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        result = convert_official_unet_checkpoint(args.src)
    except OfficialCheckpointError as exc:
        print(f'error: {exc}', file=sys.stderr)
        return 1
    make_parent_dir(args.dst)
    torch.save(dict(state_dict=result.state_dict, meta=result.meta), args.dst)
    print(f'converted {len(result.state_dict)} tensors of the official '
          f'UNet_kcla network into a segmentor checkpoint for '
          f"{result.meta['config']} and the configs built on it: {args.dst}")
    print('the official network forgets the KCLA state after the first '
          'block of each stage; kcla_mm carries it (the paper). For the '
          'official outputs add --cfg-options '
          'model.backbone.carry_state=False')
    print(f'dropped {len(result.dropped)} official keys with no counterpart '
          'in the segmentor:')
    for key, reason in result.dropped.items():
        print(f'  {key}  ({reason})')
    return 0


if __name__ == '__main__':
    sys.exit(main())
