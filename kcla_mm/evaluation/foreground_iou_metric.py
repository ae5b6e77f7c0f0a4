# Copyright (c) kcla_mm contributors. Licensed under the Apache License 2.0.
from typing import Dict

import numpy as np
from mmseg.evaluation import IoUMetric
from mmseg.registry import METRICS


@METRICS.register_module()
class ForegroundIoUMetric(IoUMetric):
    """mmseg's IoUMetric, plus the IoU and Dice of each foreground class.

    Medical segmentation papers quote the lesion/polyp class's IoU and Dice
    (DSC) rather than the mean over background and foreground; they are
    reported as ``IoU.<class>`` and ``Dice.<class>`` (percent), beside
    ``mIoU`` and ``mDice``. The first class is taken as background.
    """

    def compute_metrics(self, results: list) -> Dict[str, float]:
        metrics = super().compute_metrics(results)
        if self.format_only:
            return metrics
        areas = [sum(r) for r in zip(*results)]
        per_class = self.total_area_to_metrics(*areas, ['mIoU', 'mDice'],
                                               self.nan_to_num, self.beta)
        for i, name in enumerate(self.dataset_meta['classes'][1:], start=1):
            metrics[f'IoU.{name}'] = float(
                np.round(per_class['IoU'][i] * 100, 2))
            metrics[f'Dice.{name}'] = float(
                np.round(per_class['Dice'][i] * 100, 2))
        return metrics
