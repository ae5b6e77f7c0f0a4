# Copyright (c) kcla_mm contributors. Licensed under the Apache License 2.0.
from typing import Dict, Optional, Sequence

import numpy as np
import torch
from mmengine.evaluator import BaseMetric
from mmseg.registry import METRICS


@METRICS.register_module()
class PooledPixelMetric(BaseMetric):
    """The five figures of the paper's segmentation code (its
    ``engine.py``), from one foreground/background confusion matrix over
    every pixel of the whole split.

    A pixel is predicted foreground where the foreground probability is
    ``>= threshold`` (0.5): the one-channel probability the segmentor
    stores in ``seg_logits`` (mmseg applies the sigmoid there for
    ``out_channels=1``), else ``pred_sem_seg == 1``. It is foreground in
    the ground truth where ``gt_sem_seg == 1``; ``ignore_index`` pixels
    are left out. With TP, FP, FN, TN summed over all pixels of all images
    (not per image, not per class), the keys are, in percent::

        official/fg_IoU       100 * TP / (TP + FP + FN)
        official/DSC          100 * 2TP / (2TP + FP + FN)
        official/accuracy     100 * (TP + TN) / (TP + FP + FN + TN)
        official/sensitivity  100 * TP / (TP + FN)
        official/specificity  100 * TN / (TN + FP)

    plus the four counts (``official/TP`` ...). ``fg_IoU`` is what the
    official code logs, and the paper reports, as "mIoU": the IoU of the
    foreground alone, pooled over the split. It is not mmseg's ``mIoU``
    (the mean of the per-class IoUs, background included, of
    ``IoUMetric``/``ForegroundIoUMetric``), which is higher. A figure whose
    denominator is 0 (no foreground predicted nor present, for
    ``fg_IoU``/``DSC``/``sensitivity``; no background, for
    ``specificity``) is 0, as in the official code, not NaN.

    Args:
        threshold (float): foreground where probability >= threshold.
        ignore_index (int): label left out. Defaults to 255.
        prefix (str): key prefix. Defaults to ``'official'``.
    """
    default_prefix = 'official'

    def __init__(self,
                 threshold: float = 0.5,
                 ignore_index: int = 255,
                 collect_device: str = 'cpu',
                 prefix: Optional[str] = None,
                 **kwargs) -> None:
        super().__init__(collect_device=collect_device, prefix=prefix)
        self.threshold = threshold
        self.ignore_index = ignore_index

    def foreground(self, data_sample: dict) -> torch.Tensor:
        logits = data_sample.get('seg_logits')
        if logits is not None and logits['data'].shape[0] == 1:
            return logits['data'][0] >= self.threshold
        return data_sample['pred_sem_seg']['data'][0] == 1

    def process(self, data_batch: dict, data_samples: Sequence[dict]) -> None:
        for data_sample in data_samples:
            pred = self.foreground(data_sample)
            label = data_sample['gt_sem_seg']['data'][0].to(pred.device)
            if pred.shape != label.shape:
                raise ValueError(
                    f'{type(self).__name__}: prediction {tuple(pred.shape)} '
                    f'and ground truth {tuple(label.shape)} differ in size')
            valid = label != self.ignore_index
            if ((label != 0) & (label != 1) & valid).any():
                raise ValueError(f'{type(self).__name__}: ground truth '
                                 'labels must be 0, 1 or ignore_index')
            pred, truth = pred[valid], label[valid] == 1
            tp = int((pred & truth).sum())
            fp = int((pred & ~truth).sum())
            fn = int((~pred & truth).sum())
            tn = int((~pred & ~truth).sum())
            self.results.append((tp, fp, fn, tn))

    @staticmethod
    def figures(tp: int, fp: int, fn: int, tn: int) -> Dict[str, float]:
        """The official five figures (percent) of one confusion matrix."""

        def ratio(num, den):
            return 100. * num / den if den != 0 else 0.

        return {
            'fg_IoU': ratio(tp, tp + fp + fn),
            'DSC': ratio(2 * tp, 2 * tp + fp + fn),
            'accuracy': ratio(tp + tn, tp + fp + fn + tn),
            'sensitivity': ratio(tp, tp + fn),
            'specificity': ratio(tn, tn + fp),
        }

    def compute_metrics(self, results: list) -> Dict[str, float]:
        tp, fp, fn, tn = (
            int(v) for v in np.sum(
                np.asarray(results, dtype=np.int64).reshape(-1, 4), axis=0))
        metrics = {
            k: round(v, 4)
            for k, v in self.figures(tp, fp, fn, tn).items()
        }
        metrics.update(TP=tp, FP=fp, FN=fn, TN=tn)
        return metrics
