from .medical_seg import (BinaryMedicalSegDataset, EmptySplitError,
                          ISIC2017Dataset, ISIC2018Dataset, KvasirSEGDataset)
from .transforms import (MeanStdMinMaxNormalize, RandomRotateNearest,
                         ResizeThresholdMask)

__all__ = [
    'BinaryMedicalSegDataset', 'EmptySplitError', 'ISIC2017Dataset',
    'ISIC2018Dataset', 'KvasirSEGDataset', 'MeanStdMinMaxNormalize',
    'RandomRotateNearest', 'ResizeThresholdMask'
]
