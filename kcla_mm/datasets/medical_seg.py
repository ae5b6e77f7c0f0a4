# Copyright (c) kcla_mm contributors. Licensed under the Apache License 2.0.
"""Binary medical segmentation datasets in the mmseg layout written by
tools/dataset_converters/prepare_isic.py and prepare_kvasir.py::

    data_root/img_dir/{train,val,test}/<id>.jpg
    data_root/ann_dir/{train,val,test}/<id>.png   (0 background, 1 object)
"""
import os.path as osp
from typing import List

from mmseg.datasets import BaseSegDataset
from mmseg.registry import DATASETS


class EmptySplitError(ValueError):
    """A dataset split without a single sample."""


class BinaryMedicalSegDataset(BaseSegDataset):
    """Background / object masks stored as png with values 0 and 1.

    A split without samples is refused when the annotations load
    (``full_init``; with ``lazy_init=True`` not before) with an
    :class:`EmptySplitError` naming the folder (and ``ann_file``) it read,
    instead of mmengine's "need at least one array to concatenate".
    """

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

    def load_data_list(self) -> List[dict]:
        img_dir = self.data_prefix.get('img_path')
        if (img_dir is not None and not self.ann_file and not self.backend_args
                and not osp.isdir(img_dir)):
            raise FileNotFoundError(
                f'{type(self).__name__}: image folder {img_dir} not found '
                f'(data_root={self.data_root}, data_prefix={self.data_prefix}'
                ')')
        data_list = super().load_data_list()
        if not data_list:
            source = (f"ann_file {self.ann_file} lists no image" if
                      self.ann_file else f"no '*{self.img_suffix}' image in "
                      f'{img_dir}')
            raise EmptySplitError(
                f'{type(self).__name__}: empty split, {source} (data_root='
                f'{self.data_root}, data_prefix={self.data_prefix}): point '
                'data_root / data_prefix at a prepared split '
                '(tools/dataset_converters/) with at least one sample')
        return data_list


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
