from .paper_transforms import (MeanStdMinMaxNormalize, RandomRotateNearest,
                               ResizeThresholdMask)

__all__ = [
    'MeanStdMinMaxNormalize', 'RandomRotateNearest', 'ResizeThresholdMask'
]
