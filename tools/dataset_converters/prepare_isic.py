"""Convert the official ISIC 2017 / 2018 Task 1 archives (as extracted) to
the mmseg layout read by ISIC2017Dataset / ISIC2018Dataset.

    python tools/dataset_converters/prepare_isic.py --year 2017 RAW OUT
    python tools/dataset_converters/prepare_isic.py --year 2018 RAW OUT \
        [--val-ratio 0.1 --test-ratio 0.2 --seed 0]   # training part only

RAW holds the extracted folders, e.g. for 2017
ISIC-2017_Training_Data/ISIC_0000000.jpg (the *_superpixels.png beside the
images are ignored) and ISIC-2017_Training_Part1_GroundTruth/
ISIC_0000000_segmentation.png, likewise Validation and Test_v2; for 2018
ISIC2018_Task1-2_Training_Input/ and ISIC2018_Task1_Training_GroundTruth/,
likewise Validation and Test where present. When 2018 has only the
training part, it is split with --seed and the ratios.

OUT gets img_dir/{train,val,test}/<id>.jpg and ann_dir/{train,val,test}/
<id>.png with values 0 (background) and 1 (lesion). An image without a
mask, a mask without an image, or an unreadable file stops the tool with an
error naming it; so does a split that would be empty (a ratio of 0, or
one that rounds to no sample), before anything is written: every pair is
read and checked first. OUT must be new or have empty img_dir/ and ann_dir/
(a second run into it is refused rather than mixed with the first's files).
Images keep their size unless --size W H is given.
"""
import argparse
import os.path as osp
import sys

from kcla_mm.datasets.preparation import (ISIC_LAYOUTS, PreparationError,
                                          pair_images_and_masks, random_split,
                                          ratio_counts, refuse_empty_splits,
                                          write_splits)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description='Convert ISIC 2017/2018 Task 1 to the mmseg layout')
    parser.add_argument('raw', help='folder with the extracted archives')
    parser.add_argument('out', help='output data_root')
    parser.add_argument(
        '--year', type=int, choices=sorted(ISIC_LAYOUTS), required=True)
    parser.add_argument(
        '--val-ratio',
        type=float,
        default=0.1,
        help='2018 with only the training part: share of '
        'it used for val')
    parser.add_argument(
        '--test-ratio',
        type=float,
        default=0.2,
        help='2018 with only the training part: share of '
        'it used for test')
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument(
        '--size',
        type=int,
        nargs=2,
        metavar=('W', 'H'),
        help='resize images and masks (default: keep)')
    args = parser.parse_args(argv)
    try:
        ratio_counts(1, args.val_ratio, args.test_ratio)
    except PreparationError:
        parser.error(f'--val-ratio={args.val_ratio} and --test-ratio='
                     f'{args.test_ratio} must be in [0, 1) with a sum '
                     'below 1')
    for split, ratio in (('val', args.val_ratio), ('test', args.test_ratio)):
        if ratio == 0:
            parser.error(f'--{split}-ratio=0 would leave the {split} split '
                         'empty: give a ratio above 0 (nothing was written)')
    return args


def collect(raw: str, year: int, split: str):
    image_dir, mask_dir = (osp.join(raw, d) for d in ISIC_LAYOUTS[year][split])
    return pair_images_and_masks(
        image_dir,
        mask_dir,
        mask_stem=lambda stem: f'{stem}_segmentation',
        image_exclude=('_superpixels', ))


def main(argv=None) -> int:
    args = parse_args(argv)
    layout = ISIC_LAYOUTS[args.year]
    try:
        present = {
            split: osp.isdir(osp.join(args.raw, layout[split][0]))
            for split in layout
        }
        if not present['train']:
            raise PreparationError(
                f'{osp.join(args.raw, layout["train"][0])}: folder not found')
        if all(present.values()):
            splits = {s: collect(args.raw, args.year, s) for s in layout}
        elif args.year == 2018 and not present['val'] and not present['test']:
            samples = collect(args.raw, args.year, 'train')
            n = len(samples)
            counts = ratio_counts(n, args.val_ratio, args.test_ratio)
            refuse_empty_splits(
                counts,
                dict(
                    train=f'--val-ratio={args.val_ratio} and --test-ratio='
                    f'{args.test_ratio} of {n} samples',
                    val=f'--val-ratio={args.val_ratio} of {n} samples',
                    test=f'--test-ratio={args.test_ratio} of {n} samples'))
            splits = random_split(samples, counts, args.seed)
        else:
            missing = [layout[s][0] for s, ok in present.items() if not ok]
            raise PreparationError(
                f'{args.raw}: missing {", ".join(missing)} (ISIC {args.year} '
                'needs the training, validation and test parts' +
                (', or the training part alone' if args.year == 2018 else '') +
                ')')
        counts = write_splits(splits, args.out,
                              tuple(args.size) if args.size else None)
    except PreparationError as exc:
        print(f'error: {exc}', file=sys.stderr)
        return 1
    print(f'ISIC {args.year} -> {args.out}: ' +
          ', '.join(f'{s} {n}' for s, n in counts.items()))
    return 0


if __name__ == '__main__':
    sys.exit(main())
