"""Publish a trained checkpoint: keep only ``meta`` and ``state_dict``, save,
and name the file after its sha256 (mmdet's model-zoo convention).

    python tools/model_converters/publish_model.py IN OUT [--keep-ema]

writes ``OUT-<first 8 hex of the output's sha256>.pth`` (a ``.pth`` suffix of
OUT is optional) and prints its path and full sha256. The result loads with
``torch.load(weights_only=True)`` and no allow-list; IN may be a training
checkpoint of tools/train.py (optimizer, schedulers and MessageHub logs are
dropped).
"""
import argparse
import sys

from kcla_mm.model_zoo.publish import (CheckpointPublishError,
                                       publish_checkpoint)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description='Process a checkpoint to be published')
    parser.add_argument('in_file', help='input checkpoint filename')
    parser.add_argument('out_file', help='output checkpoint filename')
    parser.add_argument(
        '--keep-ema',
        action='store_true',
        help="also keep mmengine's EMAHook 'ema_state_dict' (with EMAHook "
        "the 'state_dict' already holds the averaged weights)")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        result = publish_checkpoint(
            args.in_file, args.out_file, keep_ema=args.keep_ema)
    except CheckpointPublishError as exc:
        print(f'error: {exc}', file=sys.stderr)
        return 1
    if result['dropped']:
        print(f"dropped: {', '.join(result['dropped'])}")
    print(f"kept: {', '.join(result['kept'])}")
    print(f"sha256: {result['sha256']}")
    print(f"published {result['path']}")
    return 0


if __name__ == '__main__':
    sys.exit(main())
