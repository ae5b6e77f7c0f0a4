# Copyright (c) kcla_mm contributors. Licensed under the Apache License 2.0.
"""Backbone, weights and image for the analysis tools."""
import copy
import os.path as osp
from collections import OrderedDict
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

    The checkpoint is loaded by :func:`load_backbone_weights`.

    Raises:
        CheckpointError: The file is missing, not a PyTorch checkpoint, or
            holds NaN/Inf tensors (one line naming the file).
        ValueError: Its keys or shapes do not match the backbone.
    """
    backbone_cfg = copy.deepcopy(
        backbone_cfg if backbone_cfg is not None else backbone_config(cfg))
    backbone_cfg['init_cfg'] = None
    model = build_backbone(backbone_cfg, cfg.get('default_scope', 'mmdet'))
    if checkpoint is None:
        model.init_weights()
    else:
        load_backbone_weights(model, checkpoint, backbone_cfg['type'])
    return model.eval()


def load_backbone_weights(model: nn.Module,
                          checkpoint: str,
                          name: Optional[str] = None) -> None:
    """Loads ``checkpoint`` into the backbone ``model``; the keys and shapes
    must match exactly.

    The checkpoint may be a training checkpoint of a whole detector or
    segmentor (its ``backbone.*`` keys are used) or a backbone state dict
    (``module.`` prefixes of a wrapped model are stripped). mmengine loads
    it (:meth:`mmengine.runner.CheckpointLoader.load_checkpoint`, so URLs
    and ``torchvision://`` names work too) under
    :func:`~kcla_mm.utils.checkpoint_loading.checked_checkpoint_loading`:
    a local file is read as mmengine reads it on this torch
    (``weights_only=True`` with mmengine's logging types allow-listed on
    torch >= 2.6), and a bad file or NaN/Inf tensors are refused in one
    line. The weights go in by mmengine's ``load_state_dict(...,
    strict=True)``, as ``load_checkpoint(..., strict=True, revise_keys=...)``
    would put them, except that ``revise_keys`` only renames keys and cannot
    drop a detector's neck and head keys, which strict loading would report
    as unexpected.

    Args:
        model (nn.Module): The backbone.
        checkpoint (str): The file (or URL, ``torchvision://...``).
        name (str, optional): The backbone's name in the error message.
            Defaults to the model's class name.

    Raises:
        CheckpointError: The file is missing, not a PyTorch checkpoint, or
            holds NaN/Inf tensors (one line naming the file).
        ValueError: Its keys or shapes do not match the backbone.
    """
    from mmengine.runner import CheckpointLoader, load_state_dict

    from kcla_mm.utils.checkpoint_loading import (checked_checkpoint_loading,
                                                  without_module_prefix)
    with checked_checkpoint_loading():
        ckpt = CheckpointLoader.load_checkpoint(
            checkpoint, map_location='cpu', logger='silent')
    if not isinstance(ckpt, dict):
        raise ValueError(f'checkpoint {checkpoint}: no state dict in it '
                         f'(a {type(ckpt).__name__})')
    state = ckpt.get('state_dict', ckpt)
    prefix = 'backbone.'
    if any(k.startswith(prefix) for k in state):
        state = OrderedDict((k[len(prefix):], v) for k, v in state.items()
                            if k.startswith(prefix))
    else:
        state = without_module_prefix(state)
    try:
        load_state_dict(model, state, strict=True, logger=None)
    except RuntimeError as exc:
        raise ValueError(
            f'checkpoint {checkpoint} does not match the config\'s '
            f'{name or type(model).__name__}: {_mismatch_summary(str(exc))}'
        ) from None


def _mismatch_summary(message: str, named: int = 3) -> str:
    """mmengine's strict-loading message (one line per kind of mismatch,
    listing every key) on one line, naming the first ``named`` keys of
    each kind."""
    parts = []
    for line in message.splitlines():
        line = line.strip()
        if not line or line.startswith('The model and loaded state dict'):
            continue
        if line.startswith('size mismatch'):
            parts.append(line.rstrip('.'))
            continue
        head, sep, keys = line.partition(': ')
        keys = [k for k in keys.split(', ') if k]
        more = f' ... ({len(keys)} in all)' if len(keys) > named else ''
        parts.append(f'{head}{sep}{", ".join(keys[:named])}{more}')
    shapes = [p for p in parts if p.startswith('size mismatch')]
    others = [p for p in parts if not p.startswith('size mismatch')]
    if len(shapes) > named:
        shapes.append(f'{len(shapes) - named} more of other shape')
        del shapes[named:-1]
    return '; '.join(others + shapes)


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
