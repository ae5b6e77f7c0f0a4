"""Convert Kvasir-SEG (as extracted) to the mmseg layout read by
KvasirSEGDataset.

    python tools/dataset_converters/prepare_kvasir.py RAW OUT
    python tools/dataset_converters/prepare_kvasir.py RAW OUT \
        --random-split [--seed 0 --train 880 --val 120]
    python tools/dataset_converters/prepare_kvasir.py RAW OUT \
        --split-files train.txt val.txt [test.txt]

RAW holds Kvasir-SEG/images/<id>.jpg and Kvasir-SEG/masks/<id>.jpg. The
masks are jpg, so they carry compression noise: they are thresholded at
128. By default the 1000 images are split as the paper's code splits them:
the official 700 train / 300 val id lists (github bgx666/KCLA,
segmentation/data/kvasir/), shipped with kcla_mm as
kcla_mm/datasets/splits/kvasir_seg_official_{train,val}.txt.
--random-split splits them 880/120 (train/val, --train/--val) with a fixed
seed instead; --split-files reads your own lists (one id a line).
OUT gets img_dir/{split}/<id>.jpg and ann_dir/{split}/<id>.png with values
0/1. An image without a mask, a mask without an image, an id of a split
list that is not in the archive (or an archive image in no split list), or
an unreadable file stops the tool with an error naming it; so does a split
that would be empty (--train or --val below 1, an empty split file), before
anything is written: every pair is read and checked first. OUT must be new
or have empty img_dir/ and ann_dir/ (a second run into it is refused rather
than mixed with the first's files).
"""
import argparse
import os.path as osp
import sys

from kcla_mm.datasets.preparation import (PreparationError,
                                          kvasir_official_split_files,
                                          pair_images_and_masks, random_split,
                                          read_split_file, refuse_empty_splits,
                                          write_splits)

SPLIT_NAMES = ('train', 'val', 'test')
RANDOM_DEFAULTS = dict(train=880, val=120, seed=0)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description='Convert Kvasir-SEG to the mmseg layout (default: the '
        "paper's official 700/300 split)")
    parser.add_argument('raw', help='folder that contains Kvasir-SEG/')
    parser.add_argument('out', help='output data_root')
    split = parser.add_mutually_exclusive_group()
    split.add_argument(
        '--random-split',
        action='store_true',
        help='a seeded random split of --train/--val images instead of the '
        'official one')
    split.add_argument(
        '--split-files',
        nargs='+',
        metavar='TXT',
        help='train.txt val.txt [test.txt], one id a line, instead of the '
        'official split')
    parser.add_argument(
        '--train',
        type=int,
        help=f'--random-split: train images ({RANDOM_DEFAULTS["train"]})')
    parser.add_argument(
        '--val',
        type=int,
        help=f'--random-split: val images ({RANDOM_DEFAULTS["val"]})')
    parser.add_argument(
        '--seed',
        type=int,
        help=f'--random-split: seed ({RANDOM_DEFAULTS["seed"]})')
    parser.add_argument(
        '--size',
        type=int,
        nargs=2,
        metavar=('W', 'H'),
        help='resize images and masks (default: keep)')
    args = parser.parse_args(argv)
    given = [o for o in RANDOM_DEFAULTS if getattr(args, o) is not None]
    if given and not args.random_split:
        parser.error(', '.join(f'--{o}' for o in given) +
                     ' only apply with --random-split (nothing was written)')
    for option, default in RANDOM_DEFAULTS.items():
        if getattr(args, option) is None:
            setattr(args, option, default)
    if args.random_split:
        for option in ('train', 'val'):
            count = getattr(args, option)
            if count < 1:
                parser.error(f'--{option}={count} would leave the {option} '
                             'split empty: give at least 1 (nothing was '
                             'written)')
    return args


def splits_from_files(samples, files):
    """split -> samples, from split lists (train, val[, test]); every id
    in exactly one list and in the archive, every archive image in one
    list."""
    if len(files) > len(SPLIT_NAMES):
        raise PreparationError(
            f'--split-files takes at most {len(SPLIT_NAMES)} files')
    by_name = {s.name: s for s in samples}
    splits, used = {}, {}
    for split, path in zip(SPLIT_NAMES, files):
        if not osp.isfile(path):
            raise PreparationError(f'{path}: split file not found')
        ids = read_split_file(path)
        for sample_id in ids:
            if sample_id not in by_name:
                raise PreparationError(
                    f'{path}: id {sample_id!r} is not in the archive')
            if sample_id in used:
                raise PreparationError(
                    f'{path}: id {sample_id!r} is also in {used[sample_id]}')
            used[sample_id] = path
        splits[split] = [by_name[i] for i in ids]
        refuse_empty_splits({split: splits[split]},
                            {split: f'--split-files: {path} lists no id'})
    left = sorted(set(by_name) - set(used))
    if left:
        raise PreparationError(
            f'{len(left)} archive images are in no split file, e.g. id '
            f'{left[0]!r} ({by_name[left[0]].image}); split files: ' +
            ', '.join(files))
    return splits


def main(argv=None) -> int:
    args = parse_args(argv)
    root = osp.join(args.raw, 'Kvasir-SEG')
    try:
        samples = pair_images_and_masks(
            osp.join(root, 'images'),
            osp.join(root, 'masks'),
            mask_stem=lambda stem: stem)
        if args.random_split:
            splits = random_split(samples,
                                  dict(train=args.train,
                                       val=args.val), args.seed)
        else:
            files = args.split_files or list(
                kvasir_official_split_files().values())
            splits = splits_from_files(samples, files)
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
