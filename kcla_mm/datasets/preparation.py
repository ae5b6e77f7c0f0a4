# Copyright (c) kcla_mm contributors. Licensed under the Apache License 2.0.
"""Turn the official medical segmentation archives, as extracted, into the
mmseg layout (img_dir/{split}, ann_dir/{split}, masks 0/1 png).

Every image must have exactly one mask and every mask one image; an
unmatched or unreadable file stops the conversion with an error naming it,
so that nothing is dropped silently. Every pair is checked, and an output
folder that already holds converted files refused, before the first file
is written.
"""
import os
import os.path as osp
import random
import shutil
from dataclasses import dataclass
from typing import (Callable, Dict, List, Optional, Sequence, Sized, Tuple,
                    Union)

import cv2
import numpy as np

IMAGE_EXTENSIONS = ('.jpg', '.jpeg', '.png')

# The official ISIC Task 1 folders, as extracted: split -> (images, masks).
ISIC_LAYOUTS = {
    2017: {
        'train':
        ('ISIC-2017_Training_Data', 'ISIC-2017_Training_Part1_GroundTruth'),
        'val': ('ISIC-2017_Validation_Data',
                'ISIC-2017_Validation_Part1_GroundTruth'),
        'test':
        ('ISIC-2017_Test_v2_Data', 'ISIC-2017_Test_v2_Part1_GroundTruth'),
    },
    2018: {
        'train': ('ISIC2018_Task1-2_Training_Input',
                  'ISIC2018_Task1_Training_GroundTruth'),
        'val': ('ISIC2018_Task1-2_Validation_Input',
                'ISIC2018_Task1_Validation_GroundTruth'),
        'test':
        ('ISIC2018_Task1-2_Test_Input', 'ISIC2018_Task1_Test_GroundTruth'),
    },
}

# The Kvasir-SEG split of the paper's code (github bgx666/KCLA,
# segmentation/data/kvasir/{train,val}.txt): 700 / 300 image file names,
# shipped with the package (package_data) as kcla_mm/datasets/splits/.
SPLITS_DIR = osp.join(osp.dirname(osp.abspath(__file__)), 'splits')
KVASIR_OFFICIAL_SPLIT = {
    'train': 'kvasir_seg_official_train.txt',
    'val': 'kvasir_seg_official_val.txt',
}


def kvasir_official_split_files() -> Dict[str, str]:
    """split -> path of the official Kvasir-SEG id list inside the
    installed package (one file name a line)."""
    return {
        split: osp.join(SPLITS_DIR, name)
        for split, name in KVASIR_OFFICIAL_SPLIT.items()
    }


def read_split_file(path: str) -> List[str]:
    """The ids of a split file: one a line, blank lines skipped, an image
    extension (``.jpg``) dropped."""
    with open(path, encoding='utf-8') as f:
        return [osp.splitext(line.strip())[0] for line in f if line.strip()]


class PreparationError(RuntimeError):
    """A file of the raw archive that cannot be converted."""


@dataclass
class Sample:
    name: str  # output file stem
    image: str
    mask: str


def list_files(
    folder: str,
    extensions=IMAGE_EXTENSIONS,
    exclude_suffixes: Sequence[str] = ()
) -> Dict[str, str]:
    """stem -> path of the files in ``folder`` with one of ``extensions``,
    skipping stems that end with one of ``exclude_suffixes``."""
    if not osp.isdir(folder):
        raise PreparationError(f'{folder}: folder not found')
    files = {}
    for entry in sorted(os.listdir(folder)):
        stem, ext = osp.splitext(entry)
        if ext.lower() not in extensions or stem.endswith(
                tuple(exclude_suffixes)):
            continue
        if stem in files:
            raise PreparationError(
                f'{osp.join(folder, entry)}: a second file for {stem!r} '
                f'(also {files[stem]})')
        files[stem] = osp.join(folder, entry)
    return files


def pair_images_and_masks(
    image_dir: str,
    mask_dir: str,
    mask_stem: Callable[[str], str],
    image_exclude: Sequence[str] = ()
) -> List[Sample]:
    """Pairs each image with the mask named ``mask_stem(image_stem)``."""
    images = list_files(image_dir, exclude_suffixes=image_exclude)
    masks = list_files(mask_dir)
    if not images:
        raise PreparationError(f'{image_dir}: no images found')
    samples = []
    expected_masks = {}
    for stem, path in images.items():
        wanted = mask_stem(stem)
        expected_masks[wanted] = path
        if wanted not in masks:
            raise PreparationError(f'{path}: no mask {wanted}.* in {mask_dir}')
        samples.append(Sample(stem, path, masks[wanted]))
    for stem, path in masks.items():
        if stem not in expected_masks:
            raise PreparationError(
                f'{path}: mask without an image in {image_dir}')
    return samples


def read_binary_mask(path: str, threshold: int = 128) -> np.ndarray:
    """Reads a 0/255 (or jpg-noisy) mask and returns 0/1 uint8."""
    mask = cv2.imread(path, cv2.IMREAD_GRAYSCALE)
    if mask is None:
        raise PreparationError(f'{path}: unreadable mask')
    return (mask >= threshold).astype(np.uint8)


def read_sample(sample: Sample,
                threshold: int = 128) -> Tuple[np.ndarray, np.ndarray]:
    """Reads and checks a pair: the image (BGR) and its 0/1 mask, which
    must be readable and of the same size; raises
    :class:`PreparationError` naming the file otherwise."""
    image = cv2.imread(sample.image, cv2.IMREAD_COLOR)
    if image is None:
        raise PreparationError(f'{sample.image}: unreadable image')
    mask = read_binary_mask(sample.mask, threshold)
    if mask.shape != image.shape[:2]:
        raise PreparationError(
            f'{sample.mask}: mask size {mask.shape[::-1]} differs from the '
            f'image {sample.image} ({image.shape[1::-1]})')
    return image, mask


def check_samples(splits: Dict[str, List[Sample]],
                  threshold: int = 128) -> None:
    """Reads every pair of every split (see :func:`read_sample`) without
    keeping it, so that a bad file stops the conversion before anything
    is written."""
    for samples in splits.values():
        for sample in samples:
            read_sample(sample, threshold)


OUTPUT_DIRS = ('img_dir', 'ann_dir')


def refuse_nonempty_output(out: str) -> None:
    """Raises :class:`PreparationError` when ``out`` is not a folder, or
    when its ``img_dir`` or ``ann_dir`` already hold a file.

    Files of an earlier conversion would be mixed with the new ones (a
    run with another seed leaves an image in two splits), and deleting
    them is the user's call, not the converter's.
    """
    if osp.exists(out) and not osp.isdir(out):
        raise PreparationError(
            f'{out}: the output path is a file, not a folder; choose an '
            'empty or new output folder (nothing was written)')
    for name in OUTPUT_DIRS:
        folder = osp.join(out, name)
        if osp.exists(folder) and not osp.isdir(folder):
            raise PreparationError(
                f'{folder} is a file, not a folder; choose an empty or new '
                'output folder (nothing was written)')
        for root, _, files in os.walk(folder):
            if files:
                raise PreparationError(
                    f'{folder} already holds files (e.g. '
                    f'{osp.join(root, sorted(files)[0])}): choose an empty '
                    f'or new output folder, or delete '
                    f'{osp.join(out, OUTPUT_DIRS[0])} and '
                    f'{osp.join(out, OUTPUT_DIRS[1])} first (nothing was '
                    'written)')


def _imwrite(path: str, array: np.ndarray, params=()) -> None:
    if not cv2.imwrite(path, array, list(params)):
        raise PreparationError(f'{path}: could not write the file')


def write_sample(sample: Sample,
                 out: str,
                 split: str,
                 size: Optional[Tuple[int, int]] = None,
                 threshold: int = 128) -> None:
    """Writes one pair to ``out``/{img_dir,ann_dir}/``split``; checks it
    first (:func:`read_sample`). :func:`write_splits` checks every pair
    and the output folder before the first write."""
    image, mask = read_sample(sample, threshold)
    img_dir = osp.join(out, 'img_dir', split)
    ann_dir = osp.join(out, 'ann_dir', split)
    os.makedirs(img_dir, exist_ok=True)
    os.makedirs(ann_dir, exist_ok=True)
    image_out = osp.join(img_dir, sample.name + '.jpg')
    if size is None and sample.image.lower().endswith(('.jpg', '.jpeg')):
        shutil.copyfile(sample.image, image_out)  # no re-encoding
    else:
        if size is not None:
            image = cv2.resize(image, size, interpolation=cv2.INTER_AREA)
        _imwrite(image_out, image, [cv2.IMWRITE_JPEG_QUALITY, 95])
    if size is not None:
        mask = cv2.resize(mask, size, interpolation=cv2.INTER_NEAREST)
    _imwrite(osp.join(ann_dir, sample.name + '.png'), mask)


def refuse_empty_splits(splits: Dict[str, Union[int, Sized]],
                        options: Optional[Dict[str, str]] = None) -> None:
    """Raises :class:`PreparationError` when a split has no sample.

    An empty split would be written without a word and fail only when a
    run reads it (an empty validation split: at start-up, with numpy's
    "need at least one array to concatenate").

    Args:
        splits (dict): split name -> its samples, or their number.
        options (dict, optional): split name -> the command-line setting
            that sized it, named in the message.
    """
    options = options or {}
    for split, samples in splits.items():
        if (samples if isinstance(samples, int) else len(samples)) == 0:
            setting = f' ({options[split]})' if split in options else ''
            raise PreparationError(
                f'the {split} split would be empty{setting}: every split '
                'needs at least one sample; nothing was written')


def write_splits(splits: Dict[str, List[Sample]],
                 out: str,
                 size: Optional[Tuple[int, int]] = None,
                 threshold: int = 128) -> Dict[str, int]:
    """Writes every split to ``out``. Before writing anything, refuses an
    empty split (:func:`refuse_empty_splits`), an output folder whose
    ``img_dir``/``ann_dir`` already hold files
    (:func:`refuse_nonempty_output`) and any unreadable or mismatched pair
    (:func:`check_samples`: each pair is read once to check it and once
    more to write it, so that memory stays at one pair)."""
    refuse_empty_splits(splits)
    refuse_nonempty_output(out)
    check_samples(splits, threshold)
    for split, samples in splits.items():
        for sample in samples:
            write_sample(sample, out, split, size, threshold)
    return {split: len(samples) for split, samples in splits.items()}


def random_split(samples: List[Sample], counts: Dict[str, int],
                 seed: int) -> Dict[str, List[Sample]]:
    """Shuffles with ``seed`` and cuts into consecutive splits of the given
    sizes (the last split takes the rest when its count is -1)."""
    order = sorted(samples, key=lambda s: s.name)
    random.Random(seed).shuffle(order)
    splits, start = {}, 0
    for i, (split, count) in enumerate(counts.items()):
        last = i == len(counts) - 1
        end = len(order) if (last and count == -1) else start + count
        if end > len(order) or (last and end != len(order)):
            raise PreparationError(
                f'cannot split {len(order)} samples into {dict(counts)}')
        splits[split] = order[start:end]
        start = end
    return splits


def ratio_counts(total: int, val_ratio: float,
                 test_ratio: float) -> Dict[str, int]:
    if not (0 <= val_ratio < 1 and 0 <= test_ratio < 1
            and val_ratio + test_ratio < 1):
        raise PreparationError(
            f'val_ratio={val_ratio} and test_ratio={test_ratio} must be '
            'in [0, 1) with a sum below 1')
    n_val = round(total * val_ratio)
    n_test = round(total * test_ratio)
    return dict(train=total - n_val - n_test, val=n_val, test=n_test)
