from .foreground_iou_metric import ForegroundIoUMetric
from .pooled_pixel_metric import PooledPixelMetric

__all__ = ['ForegroundIoUMetric', 'PooledPixelMetric']
