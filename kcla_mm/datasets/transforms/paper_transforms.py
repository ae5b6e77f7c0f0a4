# Copyright (c) kcla_mm contributors. Licensed under the Apache License 2.0.
"""The data transforms of the paper's medical segmentation recipe (the
official ``segmentation/`` code of KCLA, itself EGE-UNet's), where mmseg's
own transforms compute something else.

The official training pipeline, in its order: normalise (mean/std, then
per-image min-max to [0, 255]), horizontal flip, vertical flip, rotation
(p=0.5 each), resize to 256x256; evaluation: normalise, resize. In mmseg::

    LoadImageFromFile, LoadAnnotations,
    MeanStdMinMaxNormalize(mean, std),           # before the augmentations
    RandomFlip(prob=0.5, direction='horizontal'),
    RandomFlip(prob=0.5, direction='vertical'),
    RandomRotateNearest(prob=0.5, degree=(0, 360)),
    ResizeThresholdMask(scale=(256, 256)),
    PackSegInputs

mmcv's ``RandomFlip`` flips as the official code does; the other three are
here because mmseg's ``Normalize``-in-the-preprocessor, ``RandomRotate``
(bilinear image, seg padding 255, angle in [-d, d]) and ``Resize`` (nearest
mask) differ.
"""
from typing import Optional, Sequence, Tuple, Union

import cv2
import numpy as np
from mmcv.transforms import BaseTransform
from mmseg.registry import TRANSFORMS


@TRANSFORMS.register_module()
class MeanStdMinMaxNormalize(BaseTransform):
    """``(img - mean) / std``, then scaled per image to [0, 255]:
    ``255 * (y - y.min()) / (y.max() - y.min())`` with the minimum and
    maximum taken over the whole image (all pixels and channels at once).

    This is the official ``myNormalize``: ``mean`` and ``std`` are single
    numbers (the official values are per dataset and differ between the
    training and the evaluation split, see the paper dataset configs). The
    result is float32, still on a 0-255 scale: no further normalisation
    follows (the data preprocessor of the paper configs has no mean/std).

    Because ``std > 0`` makes the first step an increasing affine map, the
    min-max step undoes it: the output equals
    ``255 * (img - img.min()) / (img.max() - img.min())`` whatever ``mean``
    and ``std`` are (up to rounding). They are kept so that the transform
    computes what the official one computes, in its order. An image with a
    single value everywhere (max == min), where the official code divides
    0 by 0 and feeds NaN to the network, becomes all zeros here.

    Required keys: ``img``. Modified keys: ``img`` (float32).
    """

    def __init__(self, mean: float, std: float) -> None:
        if not std > 0:
            raise ValueError(f'std must be > 0, got {std}')
        self.mean = float(mean)
        self.std = float(std)

    def transform(self, results: dict) -> dict:
        img = (results['img'].astype(np.float64) - self.mean) / self.std
        low, high = img.min(), img.max()
        if high > low:
            img = (img - low) / (high - low) * 255.
        else:
            img = np.zeros_like(img)
        results['img'] = img.astype(np.float32)
        return results

    def __repr__(self) -> str:
        return f'{type(self).__name__}(mean={self.mean}, std={self.std})'


@TRANSFORMS.register_module()
class RandomRotateNearest(BaseTransform):
    """With probability ``prob``, rotates the image and the mask by an angle
    drawn uniformly from ``degree`` (degrees, counter-clockwise, about the
    image centre, same size out), both with nearest-neighbour interpolation;
    the corners that come in are ``pad_val`` in the image and
    ``seg_pad_val`` in the mask.

    The official ``myRandomRotation(p=0.5, degree=[0, 360])`` calls
    torchvision's ``TF.rotate`` with its defaults: nearest interpolation,
    fill 0 for the image (after the min-max scaling, the image's minimum)
    and for the mask (background, not an ignored label). mmseg's
    ``RandomRotate`` interpolates the image bilinearly, pads the mask with
    255 and draws from [-d, d], hence this transform.

    The official class draws its angle once, when the transform is built,
    so one training run rotates every image by the same angle; this draws a
    new angle for every rotation (what the class's name and arguments
    describe). Pass ``degree=(a, a)`` to rotate by a fixed angle ``a``.

    Required keys: ``img``, ``gt_seg_map`` (optional). Modified keys: the
    same.
    """

    def __init__(self,
                 prob: float = 0.5,
                 degree: Sequence[float] = (0., 360.),
                 pad_val: float = 0,
                 seg_pad_val: int = 0) -> None:
        if not 0 <= prob <= 1:
            raise ValueError(f'prob must be in [0, 1], got {prob}')
        degree = tuple(float(d) for d in degree)
        if len(degree) != 2 or degree[0] > degree[1]:
            raise ValueError(f'degree must be (low, high), got {degree}')
        self.prob = prob
        self.degree = degree
        self.pad_val = pad_val
        self.seg_pad_val = seg_pad_val

    @staticmethod
    def rotate(array: np.ndarray, angle: float,
               border: Union[float, int]) -> np.ndarray:
        h, w = array.shape[:2]
        matrix = cv2.getRotationMatrix2D(((w - 1) / 2, (h - 1) / 2), angle,
                                         1.0)
        channels = array.shape[2] if array.ndim == 3 else 1
        return cv2.warpAffine(
            array,
            matrix, (w, h),
            flags=cv2.INTER_NEAREST,
            borderMode=cv2.BORDER_CONSTANT,
            borderValue=(border, ) * min(channels, 4))

    def transform(self, results: dict) -> dict:
        if np.random.rand() >= self.prob:
            return results
        angle = np.random.uniform(*self.degree)
        results['img'] = self.rotate(results['img'], angle, self.pad_val)
        if results.get('gt_seg_map') is not None:
            results['gt_seg_map'] = self.rotate(results['gt_seg_map'], angle,
                                                self.seg_pad_val)
        return results

    def __repr__(self) -> str:
        return (f'{type(self).__name__}(prob={self.prob}, degree='
                f'{self.degree}, pad_val={self.pad_val}, seg_pad_val='
                f'{self.seg_pad_val})')


@TRANSFORMS.register_module()
class ResizeThresholdMask(BaseTransform):
    """Resizes the image bilinearly to ``scale`` (w, h), and the 0/1 mask
    bilinearly too, then thresholds it: a pixel is foreground where the
    interpolated mask is ``>= mask_threshold``. Mask values other than 0
    and 1 (255, ignored) are resized with nearest interpolation and written
    back over the result.

    The official ``myResize`` resizes image and mask with torchvision's
    bilinear ``TF.resize`` (torch 2.1's torchvision: no antialiasing on
    tensors, as ``cv2.INTER_LINEAR`` here); its loss then sees the soft
    resized mask, its metric the mask thresholded at 0.5. mmseg keeps
    integer labels, so both see the thresholded mask here.

    With ``set_ori_shape=True`` (the paper's evaluation pipelines) the
    resized size also becomes ``ori_shape``: the segmentor then returns its
    prediction at 256x256 instead of the size of the file, and the metric
    compares it with the resized mask, as the official evaluation does (it
    never goes back to the original size). Predictions, e.g. of
    ``tools/infer.py``, are then 256x256 too.

    Required keys: ``img``, ``gt_seg_map`` (optional). Modified keys:
    ``img``, ``gt_seg_map``, ``img_shape``, ``scale_factor``, ``ori_shape``
    (with ``set_ori_shape``).
    """

    def __init__(self,
                 scale: Tuple[int, int] = (256, 256),
                 mask_threshold: float = 0.5,
                 set_ori_shape: bool = False,
                 ignore_index: Optional[int] = 255) -> None:
        self.scale = tuple(int(s) for s in scale)
        self.mask_threshold = mask_threshold
        self.set_ori_shape = set_ori_shape
        self.ignore_index = ignore_index

    def resize_mask(self, mask: np.ndarray) -> np.ndarray:
        binary = np.isin(mask, (0, 1))
        soft = cv2.resize(
            np.where(binary, mask, 0).astype(np.float32),
            self.scale,
            interpolation=cv2.INTER_LINEAR)
        out = (soft >= self.mask_threshold).astype(mask.dtype)
        if not binary.all():
            other = cv2.resize(
                np.where(binary, 0, mask).astype(mask.dtype),
                self.scale,
                interpolation=cv2.INTER_NEAREST)
            out = np.where(other != 0, other, out)
        return out

    def transform(self, results: dict) -> dict:
        img = results['img']
        h, w = img.shape[:2]
        results['img'] = cv2.resize(
            img, self.scale, interpolation=cv2.INTER_LINEAR)
        if results.get('gt_seg_map') is not None:
            results['gt_seg_map'] = self.resize_mask(results['gt_seg_map'])
        new_h, new_w = results['img'].shape[:2]
        results['img_shape'] = (new_h, new_w)
        results['scale_factor'] = (new_w / w, new_h / h)
        results['keep_ratio'] = False
        if self.set_ori_shape:
            results['ori_shape'] = (new_h, new_w)
        return results

    def __repr__(self) -> str:
        return (f'{type(self).__name__}(scale={self.scale}, mask_threshold='
                f'{self.mask_threshold}, set_ori_shape={self.set_ori_shape})')
