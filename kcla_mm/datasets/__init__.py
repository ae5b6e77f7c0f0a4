from .medical_seg import (BinaryMedicalSegDataset, EmptySplitError,
                          ISIC2017Dataset, ISIC2018Dataset, KvasirSEGDataset)

__all__ = [
    'BinaryMedicalSegDataset', 'EmptySplitError', 'ISIC2017Dataset',
    'ISIC2018Dataset', 'KvasirSEGDataset'
]
