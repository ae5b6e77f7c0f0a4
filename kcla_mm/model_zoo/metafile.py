# Copyright (c) kcla_mm contributors. Licensed under the Apache License 2.0.
"""OpenMMLab metafile ``Models`` entries of configs, with measured size.

An entry holds ``Name`` (the config's file name), ``In Collection``,
``Config`` (relative to the folder of ``model-index.yml``) and ``Metadata``
read from the config (task, training data, epochs or iterations, crop size,
backbone) plus ``Parameters`` and ``FLOPs`` measured by
:func:`kcla_mm.analysis.flops.analyse_config`. No ``Results`` and no
``Weights``: those belong only to a trained and published model.
"""
import os.path as osp
from typing import Any, Dict, Optional, Sequence

from mmengine.config import Config

# Dataset types -> the ``Training Data`` names of the metafiles.
DATASETS = {
    'CocoDataset': 'COCO',
    'ISIC2017Dataset': 'ISIC 2017',
    'ISIC2018Dataset': 'ISIC 2018',
    'KvasirSEGDataset': 'Kvasir-SEG',
    'ImageNet': 'ImageNet-1k',
    'CIFAR100': 'CIFAR-100',
    'CIFAR10': 'CIFAR-10',
}


def backbone_name(cfg: Config) -> str:
    """``Type-depth`` of the config's backbone, with its width settings,
    e.g. ``'KCLAResNet-18 (base_channels 32, head_dim 16)'``."""
    backbone = cfg.model.backbone
    name = f"{backbone.type}-{backbone.get('depth', '')}".rstrip('-')
    extras = [
        f'{key} {backbone[key]}' for key in ('base_channels', 'head_dim')
        if key in backbone
    ]
    return f"{name} ({', '.join(extras)})" if extras else name


def metafile_entry(config: str,
                   collection: str,
                   root: str,
                   shape: Optional[Sequence[int]] = None) -> Dict[str, Any]:
    """The metafile entry of ``config`` with measured size and FLOPs.

    Args:
        config (str): The config file.
        collection (str): The ``In Collection`` value.
        root (str): The folder that holds ``model-index.yml``; ``Config``
            is written relative to it.
        shape (Sequence[int], optional): (H, W) to count FLOPs at. Defaults
            to :func:`kcla_mm.analysis.flops.default_input_shape`
            (detection 1280x800, segmentation the crop size,
            classification the test crop).

    Returns:
        dict: ``Name``, ``In Collection``, ``Config`` and ``Metadata``.
    """
    # Here, not at the top: the model index and publishing, which load with
    # this package, need neither the FLOP counter nor mmdet/mmseg.
    from ..analysis.flops import analyse_config, config_scope
    cfg = Config.fromfile(config)
    scope = config_scope(cfg)
    dataset = cfg.train_dataloader.dataset
    while 'dataset' in dataset:  # RepeatDataset & co.
        dataset = dataset.dataset
    metadata: Dict[str, Any] = {}
    if scope == 'mmdet':
        metadata['Task'] = ('Instance Segmentation'
                            if 'mask_head' in cfg.model.get('roi_head', {})
                            else 'Object Detection')
    elif scope == 'mmseg':
        metadata['Task'] = 'Semantic Segmentation'
    else:
        metadata['Task'] = 'Image Classification'
    metadata['Training Data'] = DATASETS.get(dataset.type, dataset.type)
    train_cfg = cfg.train_cfg
    if 'max_epochs' in train_cfg:
        metadata['Epochs'] = int(train_cfg.max_epochs)
    elif 'max_iters' in train_cfg:
        metadata['Iterations'] = int(train_cfg.max_iters)
    if scope == 'mmseg' and cfg.get('crop_size'):
        metadata['Crop Size'] = 'x'.join(map(str, cfg.crop_size))
    metadata['Backbone'] = backbone_name(cfg)
    height, width = shape or (None, None)
    measured = analyse_config(cfg, height, width)
    height, width = measured['shape']
    metadata['Parameters'] = int(measured['params'])
    metadata['FLOPs'] = int(measured['flops'])
    metadata['FLOPs Input Shape'] = f'1x3x{height}x{width}'
    return {
        'Name': osp.splitext(osp.basename(config))[0],
        'In Collection': collection,
        'Config': osp.relpath(osp.abspath(config), osp.abspath(root)),
        'Metadata': metadata,
    }
