"""Write fake raw medical segmentation archives in the official layouts.

    python tools/misc/make_synthetic_medseg.py --layout isic2017 OUT \
        [--count 12]
    python tools/misc/make_synthetic_medseg.py --layout isic2018 OUT \
        [--count 12] [--train-only]
    python tools/misc/make_synthetic_medseg.py --layout kvasir OUT \
        [--count 20 | --official-split]

Images are jpg: lesion-like (ISIC: dark irregular blobs on skin-toned,
textured backgrounds) or polyp-like (Kvasir: pink bulges on reddish
mucosa). Masks are stored as the official files store them: ISIC png with
0/255 (ISIC 2017 also has *_superpixels.png beside the images and a
metadata csv; ISIC 2018 a LICENSE.txt in each folder), Kvasir jpg (0/255
with compression noise). --count is split over train/val/test for ISIC
(2:1:1), all in one folder for Kvasir. --official-split (Kvasir) names the
images after the 1000 ids of the official Kvasir-SEG split, the default of
prepare_kvasir.py, instead of --count made-up ids.
"""
import argparse
import os
import os.path as osp

import cv2
import numpy as np

from kcla_mm.datasets.preparation import (ISIC_LAYOUTS,
                                          kvasir_official_split_files,
                                          read_split_file)

# The official folder names, as prepare_isic.py reads them.
ISIC_FOLDERS = {
    'isic2017': ISIC_LAYOUTS[2017],
    'isic2018': ISIC_LAYOUTS[2018],
}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('out')
    parser.add_argument(
        '--layout', required=True, choices=['isic2017', 'isic2018', 'kvasir'])
    parser.add_argument(
        '--count', type=int, default=12, help='number of image/mask pairs')
    parser.add_argument(
        '--size', type=int, nargs=2, default=(160, 120), metavar=('W', 'H'))
    parser.add_argument(
        '--train-only',
        action='store_true',
        help='isic2018: write only the training part')
    parser.add_argument(
        '--official-split',
        action='store_true',
        help='kvasir: one pair for each id of the official split (1000), '
        'instead of --count')
    parser.add_argument('--seed', type=int, default=0)
    args = parser.parse_args(argv)
    if args.official_split and args.layout != 'kvasir':
        parser.error('--official-split is for --layout kvasir')
    if args.count < 4:
        parser.error('--count must be at least 4')
    return args


def blob_mask(rng, w, h, scale):
    """An irregular closed blob: a circle with a few random harmonics."""
    cx, cy = rng.uniform(0.3, 0.7) * w, rng.uniform(0.3, 0.7) * h
    r = scale * min(w, h) * rng.uniform(0.6, 1.0)
    angles = np.linspace(0, 2 * np.pi, 64, endpoint=False)
    radius = np.full_like(angles, r)
    for k in (2, 3, 5):
        radius += r * rng.uniform(
            0.02, 0.12) * np.cos(k * angles + rng.uniform(0, 2 * np.pi))
    pts = np.stack(
        [cx + radius * np.cos(angles), cy + radius * np.sin(angles)], 1)
    mask = np.zeros((h, w), np.uint8)
    cv2.fillPoly(mask, [np.round(pts).astype(np.int32)], 1)
    return mask


def textured(rng, w, h, base, jitter):
    img = np.empty((h, w, 3), np.float32)
    img[:] = base + rng.uniform(-jitter, jitter, size=3)
    noise = rng.normal(0, 1, size=(h // 6 + 1, w // 6 + 1, 3))
    img += cv2.resize(noise.astype(np.float32), (w, h)) * 12
    img += rng.normal(0, 5, size=img.shape)
    return img


def draw_pair(rng, w, h, kind):
    if kind == 'lesion':
        img = textured(rng, w, h, np.array([150, 170, 215]), 20)  # BGR skin
        mask = blob_mask(rng, w, h, rng.uniform(0.2, 0.35))
        colour = np.array([60, 80, 120]) + rng.uniform(-20, 20, size=3)
    else:
        img = textured(rng, w, h, np.array([70, 90, 190]), 20)  # mucosa
        mask = blob_mask(rng, w, h, rng.uniform(0.15, 0.3))
        colour = np.array([140, 150, 235]) + rng.uniform(-15, 15, size=3)
    soft = cv2.GaussianBlur(mask.astype(np.float32), (7, 7), 2)[..., None]
    img = img * (1 - soft) + (colour + rng.normal(0, 8, img.shape)) * soft
    return np.clip(img, 0, 255).astype(np.uint8), mask


def write_isic(args, rng):
    folders = ISIC_FOLDERS[args.layout]
    n_val = n_test = args.count // 4
    counts = dict(train=args.count - n_val - n_test, val=n_val, test=n_test)
    if args.train_only:
        if args.layout != 'isic2018':
            raise SystemExit('--train-only is for --layout isic2018')
        counts = dict(train=args.count)
    index = 0
    for split, count in counts.items():
        image_dir, mask_dir = (osp.join(args.out, d) for d in folders[split])
        os.makedirs(image_dir, exist_ok=True)
        os.makedirs(mask_dir, exist_ok=True)
        if args.layout == 'isic2017':
            with open(
                    osp.join(image_dir, f'{folders[split][0]}_metadata.csv'),
                    'w') as f:
                f.write('image_id,age_approximate,sex\n')
        else:
            for folder in (image_dir, mask_dir):
                with open(osp.join(folder, 'LICENSE.txt'), 'w') as f:
                    f.write('synthetic\n')
        for _ in range(count):
            stem = f'ISIC_{index:07d}'
            index += 1
            img, mask = draw_pair(rng, *args.size, 'lesion')
            cv2.imwrite(osp.join(image_dir, stem + '.jpg'), img)
            cv2.imwrite(
                osp.join(mask_dir, stem + '_segmentation.png'), mask * 255)
            if args.layout == 'isic2017':
                superpixels = rng.integers(0, 255, (*mask.shape, 3), np.uint8)
                cv2.imwrite(
                    osp.join(image_dir, stem + '_superpixels.png'),
                    superpixels)
    return counts


def write_kvasir(args, rng):
    root = osp.join(args.out, 'Kvasir-SEG')
    for folder in ('images', 'masks'):
        os.makedirs(osp.join(root, folder), exist_ok=True)
    official = [
        sample_id for path in kvasir_official_split_files().values()
        for sample_id in read_split_file(path)
    ] if args.official_split else None
    count = len(official) if official else args.count
    for i in range(count):
        # made-up ids drawn between the pairs, as before --official-split:
        # the same seed still writes the same archive
        stem = (
            official[i]
            if official else f'cju{i:04d}synthetic{rng.integers(1e6):06d}')
        img, mask = draw_pair(rng, *args.size, 'polyp')
        cv2.imwrite(osp.join(root, 'images', stem + '.jpg'), img)
        cv2.imwrite(
            osp.join(root, 'masks', stem + '.jpg'), mask * 255,
            [cv2.IMWRITE_JPEG_QUALITY, 75])
    return dict(all=count)


def main(argv=None):
    args = parse_args(argv)
    rng = np.random.default_rng(args.seed)
    counts = (
        write_kvasir(args, rng) if args.layout == 'kvasir' else write_isic(
            args, rng))
    print(f'wrote a synthetic {args.layout} archive to {args.out}: ' +
          ', '.join(f'{k} {v}' for k, v in counts.items()))


if __name__ == '__main__':
    main()
