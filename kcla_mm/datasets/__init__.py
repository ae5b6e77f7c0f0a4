from .medical_seg import (BinaryMedicalSegDataset, ISIC2017Dataset,
                          ISIC2018Dataset, KvasirSEGDataset)

__all__ = [
    'BinaryMedicalSegDataset', 'ISIC2017Dataset', 'ISIC2018Dataset',
    'KvasirSEGDataset'
]
