"""Write a small ImageNet-layout classification dataset of shapes and
textures.

    python tools/misc/make_synthetic_imagenet.py data/synthetic_imagenet \
        --classes 6 --train 150 --val 40 --size 64 --seed 0 [--ann-files]

Layout: the class folders of the official KCLA ImageNet script, which
torchvision's ImageFolder and mmpretrain's ImageNet / CustomDataset read by
scanning the folders (the sorted folder names give the labels)::

    OUT/train/n00000000/n00000000_0.JPEG ...
    OUT/val/n00000000/ILSVRC2012_val_00000001.JPEG ...

With ``--ann-files`` also mmpretrain's annotation lists and the class
names, in label order::

    OUT/meta/train.txt     n00000000/n00000000_0.JPEG 0
    OUT/meta/val.txt       n00000000/ILSVRC2012_val_00000001.JPEG 0
    OUT/meta/classes.txt   disc          (one name a line; mmpretrain's
                                          ``classes=PATH`` reads it)
    OUT/meta/synsets.txt   n00000000 disc

Class ``k`` is the ``k``-th of :data:`CLASSES` (a shape or a texture) in
folder ``n{k:08d}``. Every image has a random background (colour gradient,
blurred noise), one object of its class with random colours, position,
size and orientation, one or two random thin lines as clutter, and pixel
noise: neither colour nor position tells the class.
"""
import argparse
import os
import os.path as osp
from typing import Dict, List, Optional, Sequence, Tuple

import cv2
import numpy as np

# Label order. Solid shapes first, then textures, so that a few classes
# already mix both kinds.
CLASSES = ('disc', 'square', 'triangle', 'stripes', 'checkerboard', 'ring',
           'cross', 'dots')
TEXTURES = ('stripes', 'checkerboard', 'dots')
MIN_SIZE = 32


def wnid(label: int) -> str:
    """The WordNet-id-style folder name of a class: ``n`` + 8 digits."""
    return f'n{label:08d}'


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description='Write a synthetic ImageNet-layout dataset of shapes '
        'and textures')
    parser.add_argument('out', help='output folder (the data_root)')
    parser.add_argument(
        '--classes',
        type=int,
        default=len(CLASSES),
        help=f'number of classes, the first of {", ".join(CLASSES)}')
    parser.add_argument(
        '--train', type=int, default=150, help='training images per class')
    parser.add_argument(
        '--val', type=int, default=40, help='validation images per class')
    parser.add_argument(
        '--size', type=int, default=64, help='image side in pixels')
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument(
        '--ann-files',
        action='store_true',
        help='also write meta/train.txt, meta/val.txt, meta/classes.txt and '
        'meta/synsets.txt')
    args = parser.parse_args(argv)
    if not 2 <= args.classes <= len(CLASSES):
        parser.error(f'--classes must be between 2 and {len(CLASSES)} (the '
                     f'shapes available: {", ".join(CLASSES)}), got '
                     f'{args.classes}')
    for field in ('train', 'val'):
        if getattr(args, field) < 1:
            parser.error(f'--{field} must be at least 1, got '
                         f'{getattr(args, field)}')
    if args.size < MIN_SIZE:
        parser.error(f'--size must be at least {MIN_SIZE}, got {args.size}')
    return args


def random_colour(rng: np.random.Generator,
                  avoid: Optional[np.ndarray] = None) -> np.ndarray:
    """A random RGB colour; at least 120 (L1) away from ``avoid``, so that
    the object stays visible on its background."""
    while True:
        colour = rng.integers(0, 256, size=3).astype(np.float32)
        if avoid is None or np.abs(colour - avoid).sum() >= 120:
            return colour


def background(rng: np.random.Generator, size: int) -> np.ndarray:
    """A colour gradient with blurred noise (float32, HxWx3)."""
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) / size
    base = rng.uniform(40, 215, size=3).astype(np.float32)
    tilt = rng.uniform(-60, 60, size=(2, 3)).astype(np.float32)
    img = base + xx[..., None] * tilt[0] + yy[..., None] * tilt[1]
    noise = rng.normal(0, 1, size=(size // 8, size // 8, 3))
    img += cv2.resize(
        noise.astype(np.float32),
        (size, size), interpolation=cv2.INTER_CUBIC) * rng.uniform(5, 20)
    return img


def rotation(theta: float) -> np.ndarray:
    return np.array([[np.cos(theta), -np.sin(theta)],
                     [np.sin(theta), np.cos(theta)]])


def fixed_point(points: np.ndarray) -> np.ndarray:
    """Pixels -> cv2's fixed point with 4 fractional bits (``shift=4``):
    smooth anti-aliased edges at small sizes."""
    return np.round(np.asarray(points) * 16).astype(np.int32)


def shape_mask(rng: np.random.Generator, name: str, size: int) -> np.ndarray:
    """The float mask (HxW, 0..1) of one solid shape of class ``name``."""
    mask = np.zeros((size, size), np.uint8)
    radius = rng.uniform(0.22, 0.38) * size
    centre = rng.uniform(radius + 1, size - radius - 1, size=2)
    theta = rng.uniform(0, 2 * np.pi)
    aa = dict(lineType=cv2.LINE_AA, shift=4)
    if name in ('disc', 'ring'):
        thickness = -1  # filled
        if name == 'ring':
            thickness = max(2, int(radius * rng.uniform(0.25, 0.45)))
            radius -= thickness / 2  # cv2 centres the line on the radius
        cv2.circle(mask, tuple(fixed_point(centre).tolist()),
                   int(fixed_point(radius)), 255, thickness, **aa)
    elif name == 'square':
        corners = np.array([[-1, -1], [1, -1], [1, 1], [-1, 1]]) * 0.75
        points = radius * corners @ rotation(theta).T + centre
        cv2.fillPoly(mask, [fixed_point(points)], 255, **aa)
    elif name == 'triangle':
        angles = theta + np.array([0, 2, 4]) * np.pi / 3
        points = centre + radius * np.stack(
            [np.cos(angles), np.sin(angles)], 1)
        cv2.fillPoly(mask, [fixed_point(points)], 255, **aa)
    elif name == 'cross':
        arm = rng.uniform(0.22, 0.35)
        bar = np.array([[-1, -arm], [1, -arm], [1, arm], [-1, arm]])
        for turn in (0, np.pi / 2):
            points = radius * bar @ rotation(theta + turn).T + centre
            cv2.fillPoly(mask, [fixed_point(points)], 255, **aa)
    else:
        raise ValueError(f'{name!r} is not a solid shape')
    return mask.astype(np.float32) / 255


def texture_mask(rng: np.random.Generator, name: str, size: int) -> np.ndarray:
    """The float mask (HxW, 0..1) of one textured patch of class ``name``:
    the pattern at a random period and orientation inside a random
    rectangle of 50-100% of the side."""
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32)
    theta = rng.uniform(0, np.pi)
    u = xx * np.cos(theta) + yy * np.sin(theta)
    v = -xx * np.sin(theta) + yy * np.cos(theta)
    period = rng.uniform(0.15, 0.28) * size
    phase = rng.uniform(0, period, size=2)
    if name == 'stripes':
        pattern = np.sin(2 * np.pi * (u + phase[0]) / period) > 0
    elif name == 'checkerboard':
        pattern = (np.floor((u + phase[0]) / period) + np.floor(
            (v + phase[1]) / period)) % 2 == 0
    elif name == 'dots':
        du = (u + phase[0]) % period - period / 2
        dv = (v + phase[1]) % period - period / 2
        pattern = du**2 + dv**2 < (period * rng.uniform(0.22, 0.32))**2
    else:
        raise ValueError(f'{name!r} is not a texture')
    w, h = rng.uniform(0.5, 1.0, size=2) * size
    x0, y0 = rng.uniform(0, size - w), rng.uniform(0, size - h)
    region = (xx >= x0) & (xx < x0 + w) & (yy >= y0) & (yy < y0 + h)
    return (pattern & region).astype(np.float32)


def draw_image(rng: np.random.Generator, label: int, size: int) -> np.ndarray:
    """One RGB uint8 image (HxWx3) of class ``label``."""
    img = background(rng, size)
    name = CLASSES[label]
    if name in TEXTURES:
        mask = texture_mask(rng, name, size)
    else:
        mask = shape_mask(rng, name, size)
    colour = random_colour(rng, avoid=img.mean(axis=(0, 1)))
    img = img * (1 - mask[..., None]) + colour * mask[..., None]
    # Clutter that belongs to no class: thin lines in random colours.
    for _ in range(rng.integers(1, 3)):
        ends = rng.integers(0, size, size=4).tolist()
        cv2.line(img, tuple(ends[:2]), tuple(ends[2:]),
                 random_colour(rng).tolist(), 1, cv2.LINE_AA)
    img += rng.normal(0, rng.uniform(4, 12), size=img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)


def split_files(split: str, num_classes: int,
                count: int) -> List[Tuple[str, int]]:
    """The (path relative to OUT/split, label) of every image of a split,
    in writing order, with ImageNet's file names: ``<wnid>_<i>.JPEG`` in
    train, ``ILSVRC2012_val_<8 digits>.JPEG`` numbered from 1 in val."""
    files = []
    for label in range(num_classes):
        for i in range(count):
            if split == 'train':
                name = f'{wnid(label)}_{i}.JPEG'
            else:
                name = f'ILSVRC2012_val_{label * count + i + 1:08d}.JPEG'
            files.append((f'{wnid(label)}/{name}', label))
    return files


def check_no_stale_files(out: str, split: str,
                         files: List[Tuple[str, int]]) -> None:
    """Refuses to write into a split folder that holds other class folders
    or images: the folder scan would read them as part of the set.
    Writing the same set again is fine (the files are overwritten)."""
    split_dir = osp.join(out, split)
    if not osp.isdir(split_dir):
        return
    expected = {path for path, _ in files}
    folders = {path.split('/')[0] for path in expected}
    for entry in sorted(os.listdir(split_dir)):
        if entry not in folders:
            raise FileExistsError(
                f'{osp.join(split_dir, entry)} is not part of the set to '
                'write (other --classes, or another set?): use a new or '
                'empty OUT folder')
        for name in sorted(os.listdir(osp.join(split_dir, entry))):
            if f'{entry}/{name}' not in expected:
                raise FileExistsError(
                    f'{osp.join(split_dir, entry, name)} is not part of '
                    'the set to write (other --train/--val, or another '
                    'set?): use a new or empty OUT folder')


def write_split(out: str, split: str, files: List[Tuple[str, int]], size: int,
                rng: np.random.Generator) -> None:
    for path, label in files:
        full = osp.join(out, split, path)
        os.makedirs(osp.dirname(full), exist_ok=True)
        img = draw_image(rng, label, size)
        # cv2 writes BGR.
        if not cv2.imwrite(full, img[..., ::-1],
                           [cv2.IMWRITE_JPEG_QUALITY, 90]):
            raise OSError(f'could not write {full}')


def write_meta(out: str, num_classes: int,
               splits: Dict[str, List[Tuple[str, int]]]) -> None:
    meta = osp.join(out, 'meta')
    os.makedirs(meta, exist_ok=True)
    for split, files in splits.items():
        with open(osp.join(meta, f'{split}.txt'), 'w') as f:
            f.writelines(f'{path} {label}\n' for path, label in files)
    with open(osp.join(meta, 'classes.txt'), 'w') as f:
        f.writelines(f'{CLASSES[k]}\n' for k in range(num_classes))
    with open(osp.join(meta, 'synsets.txt'), 'w') as f:
        f.writelines(f'{wnid(k)} {CLASSES[k]}\n' for k in range(num_classes))


def main(argv: Optional[Sequence[str]] = None) -> None:
    args = parse_args(argv)
    splits = {
        'train': split_files('train', args.classes, args.train),
        'val': split_files('val', args.classes, args.val)
    }
    for split, files in splits.items():
        check_no_stale_files(args.out, split, files)
    rng = np.random.default_rng(args.seed)
    for split, files in splits.items():
        write_split(args.out, split, files, args.size, rng)
    if args.ann_files:
        write_meta(args.out, args.classes, splits)
    print(f'wrote {len(splits["train"])} train and {len(splits["val"])} val '
          f'images of {args.size}x{args.size} in {args.classes} classes to '
          f'{args.out}: {", ".join(CLASSES[:args.classes])}' +
          (' (+ meta/)' if args.ann_files else ''))


if __name__ == '__main__':
    main()
