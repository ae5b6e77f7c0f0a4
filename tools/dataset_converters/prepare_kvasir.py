"""Convert Kvasir-SEG (as extracted) to the mmseg layout read by
KvasirSEGDataset.

    python tools/dataset_converters/prepare_kvasir.py RAW OUT \
        [--seed 0 --train 880 --val 120]
    python tools/dataset_converters/prepare_kvasir.py RAW OUT \
        --split-files train.txt val.txt [test.txt]

RAW holds Kvasir-SEG/images/<id>.jpg and Kvasir-SEG/masks/<id>.jpg. The
masks are jpg, so they carry compression noise: they are thresholded at
128. Without split files the 1000 images are split 880/120 (train/val)
with a fixed seed; split files list one id per line. OUT gets
img_dir/{split}/<id>.jpg and ann_dir/{split}/<id>.png with values 0/1. An
image without a mask, a mask without an image, an id of a split file that
is not in the archive (or an archive image in no split file), or an
unreadable file stops the tool with an error naming it; so does a split
that would be empty (--train or --val below 1, an empty split file), before
anything is written.
"""
import argparse
import os.path as osp
import sys

from kcla_mm.datasets.preparation import (PreparationError,
                                          pair_images_and_masks, random_split,
                                          refuse_empty_splits, write_splits)

SPLIT_NAMES = ('train', 'val', 'test')


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description='Convert Kvasir-SEG to the mmseg layout')
    parser.add_argument('raw', help='folder that contains Kvasir-SEG/')
    parser.add_argument('out', help='output data_root')
    parser.add_argument('--train', type=int, default=880)
    parser.add_argument('--val', type=int, default=120)
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument(
        '--split-files',
        nargs='+',
        metavar='TXT',
        help='train.txt val.txt [test.txt], one id a line')
    parser.add_argument(
        '--size',
        type=int,
        nargs=2,
        metavar=('W', 'H'),
        help='resize images and masks (default: keep)')
    args = parser.parse_args(argv)
    if not args.split_files:
        for option in ('train', 'val'):
            count = getattr(args, option)
            if count < 1:
                parser.error(f'--{option}={count} would leave the {option} '
                             'split empty: give at least 1 (nothing was '
                             'written)')
    return args


def splits_from_files(samples, files):
    if len(files) > len(SPLIT_NAMES):
        raise PreparationError(
            f'--split-files takes at most {len(SPLIT_NAMES)} files')
    by_name = {s.name: s for s in samples}
    splits, used = {}, {}
    for split, path in zip(SPLIT_NAMES, files):
        if not osp.isfile(path):
            raise PreparationError(f'{path}: split file not found')
        ids = [line.strip() for line in open(path) if line.strip()]
        for sample_id in ids:
            sample_id = osp.splitext(sample_id)[0]
            if sample_id not in by_name:
                raise PreparationError(
                    f'{path}: id {sample_id!r} is not in the archive')
            if sample_id in used:
                raise PreparationError(
                    f'{path}: id {sample_id!r} is also in {used[sample_id]}')
            used[sample_id] = path
        splits[split] = [by_name[osp.splitext(i)[0]] for i in ids]
        refuse_empty_splits({split: splits[split]},
                            {split: f'--split-files: {path} lists no id'})
    left = sorted(set(by_name) - set(used))
    if left:
        raise PreparationError(
            f'{len(left)} archive images are in no split file, e.g. '
            f'{by_name[left[0]].image}')
    return splits


def main(argv=None) -> int:
    args = parse_args(argv)
    root = osp.join(args.raw, 'Kvasir-SEG')
    try:
        samples = pair_images_and_masks(
            osp.join(root, 'images'),
            osp.join(root, 'masks'),
            mask_stem=lambda stem: stem)
        if args.split_files:
            splits = splits_from_files(samples, args.split_files)
        else:
            splits = random_split(samples,
                                  dict(train=args.train,
                                       val=args.val), args.seed)
        counts = write_splits(splits, args.out,
                              tuple(args.size) if args.size else None)
    except PreparationError as exc:
        print(f'error: {exc}', file=sys.stderr)
        return 1
    print(f'Kvasir-SEG -> {args.out}: ' +
          ', '.join(f'{s} {n}' for s, n in counts.items()))
    return 0


if __name__ == '__main__':
    sys.exit(main())
