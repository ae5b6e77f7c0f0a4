"""Write a small COCO2017-layout detection/instance-segmentation dataset.

    python tools/misc/make_synthetic_coco.py data/synthetic_coco \
        --train 200 --val 50 --size 256 --seed 0

Layout (what mmdet's stock CocoDataset reads with only ``data_root`` and
``metainfo`` overrides)::

    OUT/train2017/000000000001.jpg ...
    OUT/val2017/...
    OUT/annotations/instances_train2017.json
    OUT/annotations/instances_val2017.json

Each image shows 1-4 filled circles, rectangles and triangles of varied
colour and scale on a textured background, some overlapping; every object
has a box and a polygon mask. Objects drawn later hide parts of earlier
ones, and the earlier objects' masks and boxes are cut to what stays
visible (objects left with too little are dropped), as in COCO.
"""
import argparse
import json
import os
import os.path as osp

import cv2
import numpy as np

CLASSES = ('circle', 'rectangle', 'triangle')
PALETTE = [(220, 20, 60), (0, 128, 255), (60, 180, 75)]
# Objects that keep less of their area visible than this are dropped.
MIN_VISIBLE = 0.4


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description='Write a synthetic COCO2017-layout dataset')
    parser.add_argument('out', help='output folder (the data_root)')
    parser.add_argument(
        '--train', type=int, default=200, help='number of training images')
    parser.add_argument(
        '--val', type=int, default=50, help='number of validation images')
    parser.add_argument(
        '--size', type=int, default=256, help='image side in pixels')
    parser.add_argument('--seed', type=int, default=0)
    args = parser.parse_args(argv)
    for field in ('train', 'val'):
        if getattr(args, field) < 1:
            parser.error(f'--{field} must be at least 1')
    if args.size < 64:
        parser.error('--size must be at least 64')
    return args


def textured_background(rng: np.random.Generator, size: int) -> np.ndarray:
    """Smooth colour gradient + blurred noise + faint stripes."""
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) / size
    base = rng.uniform(60, 190, size=3)
    tilt = rng.uniform(-50, 50, size=(2, 3))
    img = base + xx[..., None] * tilt[0] + yy[..., None] * tilt[1]
    noise = rng.normal(0, 1, size=(size // 8, size // 8, 3)).astype(np.float32)
    img += cv2.resize(
        noise,
        (size, size), interpolation=cv2.INTER_CUBIC) * rng.uniform(5, 20)
    period = rng.uniform(6, 20)
    img += 8 * np.sin(2 * np.pi * (xx + yy) * size / period)[..., None]
    img += rng.normal(0, 4, size=img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)


def random_shape(rng: np.random.Generator, size: int, label: int):
    """Returns the polygon (K, 2) of one object."""
    scale = rng.uniform(0.12, 0.35) * size
    cx, cy = rng.uniform(scale * 0.6, size - scale * 0.6, size=2)
    if CLASSES[label] == 'circle':
        angles = np.linspace(0, 2 * np.pi, 32, endpoint=False)
        r = scale / 2
        pts = np.stack([cx + r * np.cos(angles), cy + r * np.sin(angles)], 1)
    elif CLASSES[label] == 'rectangle':
        w, h = scale * rng.uniform(0.6, 1.2, size=2)
        theta = rng.uniform(0, np.pi / 2)
        corners = np.array([[-w, -h], [w, -h], [w, h], [-w, h]]) / 2
        rot = np.array([[np.cos(theta), -np.sin(theta)],
                        [np.sin(theta), np.cos(theta)]])
        pts = corners @ rot.T + (cx, cy)
    else:
        theta = rng.uniform(0, 2 * np.pi)
        angles = theta + np.array([0, 2, 4]) * np.pi / 3
        r = scale * 0.6
        pts = np.stack([cx + r * np.cos(angles), cy + r * np.sin(angles)], 1)
    return np.clip(pts, 0, size - 1).astype(np.float32)


def mask_to_polygons(mask: np.ndarray):
    contours, _ = cv2.findContours(mask, cv2.RETR_EXTERNAL,
                                   cv2.CHAIN_APPROX_SIMPLE)
    return [
        c.reshape(-1).astype(float).tolist() for c in contours if len(c) >= 3
    ]


def draw_image(rng: np.random.Generator, size: int):
    img = textured_background(rng, size)
    objects = []  # (label, colour, full mask)
    for _ in range(rng.integers(1, 5)):
        label = int(rng.integers(len(CLASSES)))
        pts = random_shape(rng, size, label)
        mask = np.zeros((size, size), np.uint8)
        cv2.fillPoly(mask, [np.round(pts).astype(np.int32)], 1)
        colour = tuple(int(c) for c in rng.integers(0, 256, size=3))
        objects.append((label, colour, mask))
    visible = [m.copy() for _, _, m in objects]
    for i, (label, colour, mask) in enumerate(objects):
        img[mask.astype(bool)] = colour
        for j in range(i):  # later objects hide earlier ones
            visible[j][mask.astype(bool)] = 0
    instances = []
    for (label, _, full), vis in zip(objects, visible):
        if vis.sum() < MIN_VISIBLE * full.sum() or vis.sum() < 30:
            continue
        polygons = mask_to_polygons(vis)
        if not polygons:
            continue
        ys, xs = np.nonzero(vis)
        x0, y0 = float(xs.min()), float(ys.min())
        w, h = float(xs.max() - x0 + 1), float(ys.max() - y0 + 1)
        instances.append(
            dict(
                category_id=label + 1,
                bbox=[x0, y0, w, h],
                area=float(vis.sum()),
                segmentation=polygons,
                iscrowd=0))
    return img, instances


def write_split(out: str, split: str, count: int, size: int,
                rng: np.random.Generator, first_image_id: int,
                first_ann_id: int):
    img_dir = osp.join(out, f'{split}2017')
    os.makedirs(img_dir, exist_ok=True)
    images, annotations = [], []
    ann_id = first_ann_id
    for k in range(count):
        image_id = first_image_id + k
        file_name = f'{image_id:012d}.jpg'
        img, instances = draw_image(rng, size)
        path = osp.join(img_dir, file_name)
        if not cv2.imwrite(path, img[..., ::-1],
                           [cv2.IMWRITE_JPEG_QUALITY, 95]):
            raise OSError(f'could not write {path}')
        images.append(
            dict(id=image_id, file_name=file_name, width=size, height=size))
        for inst in instances:
            annotations.append(dict(id=ann_id, image_id=image_id, **inst))
            ann_id += 1
    coco = dict(
        info=dict(description=f'kcla_mm synthetic COCO ({split})'),
        licenses=[],
        images=images,
        annotations=annotations,
        categories=[
            dict(id=i + 1, name=name, supercategory='shape')
            for i, name in enumerate(CLASSES)
        ])
    ann_dir = osp.join(out, 'annotations')
    os.makedirs(ann_dir, exist_ok=True)
    with open(osp.join(ann_dir, f'instances_{split}2017.json'), 'w') as f:
        json.dump(coco, f)
    return len(images), len(annotations), ann_id


def main(argv=None):
    args = parse_args(argv)
    rng = np.random.default_rng(args.seed)
    n_img, n_ann, next_ann = write_split(args.out, 'train', args.train,
                                         args.size, rng, 1, 1)
    v_img, v_ann, _ = write_split(args.out, 'val', args.val, args.size, rng,
                                  args.train + 1, next_ann)
    print(f'wrote {n_img} train images ({n_ann} objects) and {v_img} val '
          f'images ({v_ann} objects) of {args.size}x{args.size} to '
          f'{args.out}; classes: {", ".join(CLASSES)}')


if __name__ == '__main__':
    main()
