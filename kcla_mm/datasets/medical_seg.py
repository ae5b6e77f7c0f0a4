# Copyright (c) kcla_mm contributors. Licensed under the Apache License 2.0.
"""Binary medical segmentation datasets in the mmseg layout written by
tools/dataset_converters/prepare_isic.py and prepare_kvasir.py::

    data_root/img_dir/{train,val,test}/<id>.jpg
    data_root/ann_dir/{train,val,test}/<id>.png   (0 background, 1 object)
"""
from mmseg.datasets import BaseSegDataset
from mmseg.registry import DATASETS


class BinaryMedicalSegDataset(BaseSegDataset):
    """Background / object masks stored as png with values 0 and 1."""

    def __init__(self,
                 img_suffix: str = '.jpg',
                 seg_map_suffix: str = '.png',
                 reduce_zero_label: bool = False,
                 **kwargs) -> None:
        super().__init__(
            img_suffix=img_suffix,
            seg_map_suffix=seg_map_suffix,
            reduce_zero_label=reduce_zero_label,
            **kwargs)


@DATASETS.register_module()
class ISIC2017Dataset(BinaryMedicalSegDataset):
    """ISIC 2017 Task 1, skin lesion segmentation."""
    METAINFO = dict(
        classes=('background', 'lesion'), palette=[[0, 0, 0], [255, 0, 0]])


@DATASETS.register_module()
class ISIC2018Dataset(BinaryMedicalSegDataset):
    """ISIC 2018 Task 1, skin lesion segmentation."""
    METAINFO = dict(
        classes=('background', 'lesion'), palette=[[0, 0, 0], [255, 0, 0]])


@DATASETS.register_module()
class KvasirSEGDataset(BinaryMedicalSegDataset):
    """Kvasir-SEG, polyp segmentation."""
    METAINFO = dict(
        classes=('background', 'polyp'), palette=[[0, 0, 0], [0, 255, 0]])
