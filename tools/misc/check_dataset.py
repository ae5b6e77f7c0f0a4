"""Check the data a config reads before training on it.

    python tools/misc/check_dataset.py CONFIG [--cfg-options data_root=PATH
        KEY=VALUE ...] [--splits train val test] [--header-only] [--jobs N]

Builds every dataset of the config's train/val/test dataloaders (through
dataset wrappers) as a run would, and checks every sample's files: images
present and readable; segmentation masks present, of their image's size
and with values in the dataset's label set or its ignore index; COCO-style
annotation files: every image present, of the size the file states, every
box finite, of positive size and inside its image; no split empty. Every
problem is reported, with its file, before the tool exits.

``--cfg-options data_root=PATH`` re-points every dataset, as for
tools/train.py. Exit status: 0 when nothing is wrong, 1 when a problem was
found, 2 when the config cannot be checked (unreadable, no dataloader, its
default scope's package not installed).
"""
import argparse
import os
import sys

from kcla_mm.datasets.checks import (LOADERS, DatasetCheckError, check_config,
                                     format_summary)
from kcla_mm.utils.config import add_cfg_options, load_config


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description='Check the data a config reads before training')
    parser.add_argument('config', help='config file')
    add_cfg_options(parser)
    parser.add_argument(
        '--splits',
        nargs='+',
        choices=LOADERS,
        default=list(LOADERS),
        help='the dataloaders to check (default: all the config has)')
    parser.add_argument(
        '--header-only',
        action='store_true',
        help='read only the images\' sizes, without decoding them (fast; '
        'a truncated image passes); masks are always decoded')
    parser.add_argument(
        '--jobs',
        type=int,
        default=min(8,
                    os.cpu_count() or 1),
        help='threads that read files (default: up to 8)')
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f'--jobs={args.jobs} must be at least 1')
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        cfg = load_config(args.config, args.cfg_options)
    except Exception as exc:
        print(
            f'error: {args.config}: cannot read the config: '
            f'{type(exc).__name__}: {exc}',
            file=sys.stderr)
        return 2
    reports = []
    try:
        for report in check_config(cfg, args.splits, args.header_only,
                                   args.jobs):
            print(report.format(), flush=True)
            reports.append(report)
    except DatasetCheckError as exc:
        print(f'error: {args.config}: {exc}', file=sys.stderr)
        return 2
    print(format_summary(reports, args.config))
    return 1 if any(r.problems for r in reports) else 0


if __name__ == '__main__':
    sys.exit(main())
