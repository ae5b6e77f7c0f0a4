# Copyright (c) kcla_mm contributors. Licensed under the Apache License 2.0.
"""Backbone, weights and image for the analysis tools."""
import copy
import os.path as osp
from typing import Optional, Tuple

import torch
import torch.nn as nn
from mmengine.config import Config, ConfigDict
from mmengine.registry import init_default_scope
from torch import Tensor

# torchvision's ImageNet statistics, RGB order: what the configs use.
IMAGENET_MEAN = (123.675, 116.28, 103.53)
IMAGENET_STD = (58.395, 57.12, 57.375)


def backbone_config(cfg: Config) -> ConfigDict:
    """The config's ``model.backbone`` (or top-level ``backbone``)."""
    if 'model' in cfg and 'backbone' in cfg.model:
        return copy.deepcopy(cfg.model.backbone)
    if 'backbone' in cfg:
        return copy.deepcopy(cfg.backbone)
    raise ValueError(f'{cfg.filename}: no model.backbone or backbone')


def build_backbone(backbone_cfg: dict, scope: str = 'mmdet') -> nn.Module:
    """Builds a backbone dict through the mmdet or mmseg registry."""
    import kcla_mm  # noqa: F401  registers the backbones
    init_default_scope(scope)
    if scope == 'mmseg':
        from mmseg.registry import MODELS
    else:
        from mmdet.registry import MODELS
    return MODELS.build(backbone_cfg)


def load_backbone(cfg: Config,
                  checkpoint: Optional[str],
                  backbone_cfg: Optional[dict] = None) -> nn.Module:
    """The config's backbone in eval mode, with the checkpoint's weights or,
    when ``checkpoint`` is None, randomly initialised (its own init, not the
    config's ``Pretrained`` file).

    The checkpoint may be a training checkpoint of a whole detector or
    segmentor (its ``backbone.*`` keys are used) or a backbone state dict;
    it is read with ``weights_only=True`` (mmengine's logging types
    allow-listed; on torch < 2.6 as mmengine reads it there, see
    :func:`kcla_mm.utils.checkpoint_loading.load_checkpoint`) and must match
    the backbone exactly.

    Raises:
        CheckpointError: The file is missing, not a PyTorch checkpoint, or
            holds NaN/Inf tensors (one line naming the file).
        ValueError: Its keys or shapes do not match the backbone.
    """
    from kcla_mm.utils.checkpoint_loading import load_checkpoint
    backbone_cfg = copy.deepcopy(
        backbone_cfg if backbone_cfg is not None else backbone_config(cfg))
    backbone_cfg['init_cfg'] = None
    model = build_backbone(backbone_cfg, cfg.get('default_scope', 'mmdet'))
    if checkpoint is None:
        model.init_weights()
    else:
        ckpt = load_checkpoint(checkpoint)
        state = ckpt.get('state_dict', ckpt)
        if any(k.startswith('backbone.') for k in state):
            state = {
                k[len('backbone.'):]: v
                for k, v in state.items() if k.startswith('backbone.')
            }
        own = model.state_dict()
        missing = [k for k in own if k not in state]
        unexpected = [k for k in state if k not in own]
        mismatched = [
            k for k in own if k in state and state[k].shape != own[k].shape
        ]
        if missing or unexpected or mismatched:
            raise ValueError(
                f'checkpoint {checkpoint} does not match the config\'s '
                f'{backbone_cfg["type"]}: missing {missing[:3]}, unexpected '
                f'{unexpected[:3]}, other shape {mismatched[:3]} (first 3 '
                'of each)')
        model.load_state_dict(state)
    return model.eval()


def read_image(path: str, size: int, cfg: Optional[Config] = None) -> Tensor:
    """The image as a normalised (1, 3, size, size) RGB batch, with the
    config's data_preprocessor mean/std when it has them."""
    import mmcv
    if not osp.isfile(path):
        raise FileNotFoundError(f'image {path}: no such file')
    image = mmcv.imread(path, channel_order='rgb')
    image = mmcv.imresize(image, (size, size))
    model_cfg = cfg.get('model', {}) if cfg is not None else {}
    preprocessor = model_cfg.get('data_preprocessor') or {}
    mean = torch.tensor(preprocessor.get('mean', IMAGENET_MEAN))
    std = torch.tensor(preprocessor.get('std', IMAGENET_STD))
    x = torch.from_numpy(image).float().permute(2, 0, 1)
    return ((x - mean[:, None, None]) / std[:, None, None])[None]


def describe_weights(checkpoint: Optional[str]) -> str:
    """For plot titles: where the weights came from."""
    return 'random init' if checkpoint is None else osp.basename(checkpoint)


def config_and_backbone(
        config: str,
        expected_type: str,
        cfg_options: Optional[dict] = None) -> Tuple[Config, ConfigDict]:
    """The config and its backbone dict, checked to be of
    ``expected_type``: what the plotting tools start from.

    Args:
        config (str): The config file.
        expected_type (str): The backbone ``type`` the caller analyses,
            e.g. ``'KCLAResNet'``.
        cfg_options (dict, optional): Overrides merged into the config.

    Returns:
        tuple[Config, ConfigDict]: The config and a copy of its backbone
        dict (:func:`backbone_config`).

    Raises:
        ValueError: The backbone is of another type.
    """
    cfg = Config.fromfile(config)
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    backbone_cfg = backbone_config(cfg)
    if backbone_cfg.get('type') != expected_type:
        raise ValueError(f'{config}: backbone type='
                         f'{backbone_cfg.get("type")!r}, expected '
                         f'{expected_type}')
    return cfg, backbone_cfg
