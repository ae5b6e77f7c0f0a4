# Copyright (c) kcla_mm contributors. Licensed under the Apache License 2.0.
"""Parameters, FLOPs and activations of a whole mmdet, mmseg or mmpretrain
model.

Counted with mmengine's ``mmengine.analysis`` (fvcore's jit-trace counter):
one multiply-add counts as one FLOP, as in mmdet's and mmseg's get_flops
tools (so the figures are MACs). The model runs in eval mode on one
1x3xHxW zero image, detectors in mmdet's ``mode='tensor'`` (backbone, neck,
RPN, RoI heads, without NMS post-processing), segmentors in mmseg's and
classifiers in mmpretrain's (the logits).

mmengine has no counting rule for the ops that carry the layer attention:
:data:`kcla_mm.analysis.complexity.ATTENTION_OP_HANDLES` adds them (the
rules the backbone-level :func:`~kcla_mm.analysis.complexity.count_flops`
uses too). Every op that still has no rule is reported under
``uncounted`` with how often it ran, so nothing is dropped silently.
"""
from functools import partial
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.nn as nn
from mmengine.analysis import ActivationAnalyzer, FlopAnalyzer, parameter_count
from mmengine.config import Config
from mmengine.registry import MODELS, init_default_scope

from .complexity import ATTENTION_OP_HANDLES, fused_kcla_while_traced

SCOPES = ('mmdet', 'mmseg', 'mmpretrain')
# mmdet's get_flops default input for detectors, (H, W).
DETECTION_SHAPE = (1280, 800)


def config_scope(cfg: Config) -> str:
    """The config's ``default_scope`` (mmdet when it has none).

    Raises:
        ValueError: The scope is not one of :data:`SCOPES`.
    """
    scope = cfg.get('default_scope', 'mmdet')
    if scope not in SCOPES:
        raise ValueError(f"{cfg.filename}: default_scope is {scope!r}; "
                         f'expected one of {SCOPES}')
    return scope


def default_input_shape(cfg: Config) -> Tuple[int, int]:
    """The (H, W) that FLOPs are counted at when none is asked for.

    mmdet's get_flops default (1280, 800) for detectors; the crop size the
    segmentor is trained on for segmentors (the data preprocessor's
    ``size`` when the config has no ``crop_size``); for classifiers the
    test crop (``CenterCrop``, ImageNet) or the training crop
    (``RandomCrop``, CIFAR, whose test images are not resized).
    """
    scope = config_scope(cfg)
    if scope == 'mmpretrain':
        return classifier_input_shape(cfg)
    if scope == 'mmseg':
        size = (
            cfg.get('crop_size')
            or cfg.model.get('data_preprocessor', {}).get('size'))
        if size:
            return int(size[0]), int(size[1])
    return DETECTION_SHAPE


def classifier_input_shape(cfg: Config) -> Tuple[int, int]:
    """The (H, W) a classifier config evaluates at (see
    :func:`default_input_shape`)."""
    for loader, crop in (('test_dataloader', 'CenterCrop'),
                         ('train_dataloader', 'RandomCrop')):
        pipeline = cfg.get(loader, {}).get('dataset', {}).get('pipeline', [])
        for transform in pipeline:
            if transform.get('type') == crop:
                size = transform['crop_size']
                if isinstance(size, int):
                    return size, size
                return int(size[1]), int(size[0])  # mmpretrain: (w, h)
    raise ValueError(f'{cfg.filename}: found no CenterCrop in the test '
                     'pipeline nor RandomCrop in the training pipeline to '
                     'take the input size from; pass --shape H W')


def _data_samples(scope: str, height: int, width: int) -> Optional[List[Any]]:
    """One data sample with the meta information the heads read (None
    for classifiers, whose ``mode='tensor'`` needs none)."""
    if scope == 'mmpretrain':
        return None
    meta = dict(
        img_shape=(height, width),
        ori_shape=(height, width),
        pad_shape=(height, width),
        batch_input_shape=(height, width),
        scale_factor=(1.0, 1.0))
    if scope == 'mmdet':
        from mmdet.structures import DetDataSample
        return [DetDataSample(metainfo=meta)]
    from mmseg.structures import SegDataSample
    return [SegDataSample(metainfo=meta)]


def build_model(cfg: Config, backbone_only: bool = False) -> nn.Module:
    """``cfg.model`` (or only its backbone) built in the config's scope, in
    eval mode and with its own initialisation (no init_weights call)."""
    import kcla_mm  # noqa: F401  registers the KCLA modules
    init_default_scope(config_scope(cfg))
    model = MODELS.build(cfg.model)
    if backbone_only:
        model = model.backbone
    return model.eval()


def analyse_config(cfg: Config,
                   height: Optional[int] = None,
                   width: Optional[int] = None,
                   backbone_only: bool = False) -> Dict[str, Any]:
    """Parameters, FLOPs and activations of ``cfg``'s model on one
    ``1x3xHxW`` image.

    Args:
        cfg (Config): An mmdet, mmseg or mmpretrain config.
        height (int, optional): Input height; with ``width`` None, both
            default to :func:`default_input_shape`.
        width (int, optional): Input width.
        backbone_only (bool): Count ``model.backbone`` only. Defaults to
            False.

    Returns:
        dict: ``params``, ``flops``, ``activations`` (ints), ``shape``
        (the (H, W) counted at), ``uncounted`` (op name -> number of calls
        without a FLOP rule) and the analyzers (``flop_analyzer``,
        ``activation_analyzer``) for per-module tables.
    """
    scope = config_scope(cfg)
    if height is None or width is None:
        height, width = default_input_shape(cfg)
    model = build_model(cfg, backbone_only)
    image = torch.zeros(1, 3, height, width)
    if not backbone_only:
        # Detectors and segmentors take data samples besides the image: bind
        # them so that the traced forward sees one tensor argument.
        model.forward = partial(
            model.forward,
            data_samples=_data_samples(scope, height, width),
            mode='tensor')
    inputs = (image, )
    with torch.no_grad(), fused_kcla_while_traced(model):
        flops = FlopAnalyzer(model, inputs)
        flops.set_op_handle(**ATTENTION_OP_HANDLES)
        flops.unsupported_ops_warnings(False)
        flops.uncalled_modules_warnings(False)
        activations = ActivationAnalyzer(model, inputs)
        activations.unsupported_ops_warnings(False)
        activations.uncalled_modules_warnings(False)
        total_flops = flops.total()
        total_acts = activations.total()
    return dict(
        params=parameter_count(model)[''],
        flops=total_flops,
        activations=total_acts,
        shape=(height, width),
        uncounted=dict(flops.unsupported_ops()),
        flop_analyzer=flops,
        activation_analyzer=activations)
