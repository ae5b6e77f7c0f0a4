from .foreground_iou_metric import ForegroundIoUMetric

__all__ = ['ForegroundIoUMetric']
