# Copyright (c) kcla_mm contributors. Licensed under the Apache License 2.0.
"""Key mapping from a checkpoint of the official UNet-KCLA network (github
bgx666/KCLA, ``segmentation/models/UNet_kcla.py``, ``UNet_kcla(3, 1)``) to
the segmentor of ``configs/_base_/models/unet-paper_kcla-r18.py``
(:class:`~.backbones.KCLAResNetUNetPaper` and
:class:`~.decode_heads.UNetPaperHead` in mmseg's ``EncoderDecoder``).

Official keys and theirs here::

    encoder.conv1 / bn1                 backbone.conv1 / bn1
    encoder.layerN.layers.J.*           backbone.layerN.J.*
    encoder.layerN.attention.J.Wq       backbone.layerN.J.kcla.query_conv
        .Wk / .Wv / .bn_attention           .key_conv / .value_conv / .norm
        .adjust_channel.0 / .1              .state_adapt / .state_norm
        .norm_d (1, heads, 1, 1, 1)         .inv_tau (heads, )
    upK.conv.double_conv.{0,1,3,4}      decode_head.up_steps.{K-1}.convs.
                                            {0,0,1,1}.{conv,bn,conv,bn}
    outc.conv                           decode_head.conv_seg

The official modules that its forward pass never calls (``encoder.bn2``, a
BatchNorm of 512 channels, and stage 1 block 0's ``adjust_channel``) have
no counterpart: they are listed in the result, not silently lost.

The official file forgets the KCLA state in every block of a stage but the
first; kcla_mm carries it, as the paper's equations do. A converted
checkpoint therefore computes another function in the default model: set
``model.backbone.carry_state=False`` to get the official network's outputs.
"""
import os.path as osp
import re
from dataclasses import dataclass, field
from typing import Dict, Optional

import torch.nn as nn
from torch import Tensor

from .backbones import KCLAResNetUNetPaper
from .decode_heads import UNetPaperHead
from .official_checkpoint import (OfficialCheckpointError,
                                  map_official_tensors, read_official_weights)

#: The config whose model the converted keys are for.
UNET_CONFIG = 'configs/_base_/models/unet-paper_kcla-r18.py'

# official segmentation KCLA layer attribute -> KCLAUNetLayer attribute
UNET_KCLA_MODULE_NAMES = {
    'Wq': 'query_conv',
    'Wk': 'key_conv',
    'Wv': 'value_conv',
    'bn_attention': 'norm',
    'norm_d': 'inv_tau',
    'adjust_channel.0': 'state_adapt',
    'adjust_channel.1': 'state_norm',
}
# official DoubleConv index -> (conv module, part) in UNetPaperUp.convs
DOUBLE_CONV_PARTS = {
    '0': ('0', 'conv'),
    '1': ('0', 'bn'),
    '3': ('1', 'conv'),
    '4': ('1', 'bn'),
}
NEVER_USED = 'never used by the official forward pass'

_STEM_KEY = re.compile(r'^encoder\.(conv1|bn1)\.(.+)$')
_UNUSED_BN_KEY = re.compile(r'^encoder\.bn2\.(.+)$')
_BN_TENSORS = r'(weight|bias|running_mean|running_var|num_batches_tracked)'
_NEVER_USED_KEY = re.compile(
    rf'^encoder\.bn2\.{_BN_TENSORS}$|'
    r'^encoder\.layer1\.attention\.0\.adjust_channel\.'
    rf'(0\.(weight|bias)|1\.{_BN_TENSORS})$')
_BLOCK_KEY = re.compile(r'^encoder\.layer(\d+)\.layers\.(\d+)\.(.+)$')
_KCLA_KEY = re.compile(r'^encoder\.layer(\d+)\.attention\.(\d+)\.'
                       r'(Wq|Wk|Wv|bn_attention|norm_d|adjust_channel\.[01])'
                       r'(.*)$')
_UP_KEY = re.compile(r'^up(\d+)\.conv\.double_conv\.(\d+)\.(.+)$')
_OUT_KEY = re.compile(r'^outc\.conv\.(.+)$')


@dataclass
class UNetConversionResult:
    """A converted official UNet-KCLA checkpoint.

    Attributes:
        state_dict (dict): The segmentor's tensors (``backbone.*``,
            ``decode_head.*``).
        dropped (dict): Official key -> why it has no counterpart.
        meta (dict): What the checkpoint was converted from, the config it
            is for and the option that reproduces the official outputs.
    """
    state_dict: Dict[str, Tensor]
    dropped: Dict[str, str] = field(default_factory=dict)
    meta: dict = field(default_factory=dict)


def build_unet_paper_target() -> nn.Module:
    """The modules of ``UNET_CONFIG``'s segmentor that hold weights, with
    its keys (``backbone.*``, ``decode_head.*``): what a converted
    checkpoint must fill exactly."""
    target = nn.Module()
    target.backbone = KCLAResNetUNetPaper()
    target.decode_head = UNetPaperHead(
        in_channels=[16, 32, 64, 128, 128],
        in_index=[0, 1, 2, 3, 4],
        channels=16,
        dropout_ratio=0.,
        num_classes=2,
        out_channels=1,
        threshold=0.5,
        norm_cfg=dict(type='BN', requires_grad=True))
    return target


def official_unet_to_mm_key(key: str) -> Optional[str]:
    """Maps one official UNet-KCLA key to the segmentor's; None for the
    modules the official forward pass never uses (``encoder.bn2.*``).

    Raises:
        OfficialCheckpointError: ``key`` is not of the official network.
    """
    if _UNUSED_BN_KEY.match(key):
        return None
    match = _STEM_KEY.match(key)
    if match:
        return f'backbone.{match.group(1)}.{match.group(2)}'
    match = _KCLA_KEY.match(key)
    if match:
        stage, block, module, rest = match.groups()
        return (f'backbone.layer{stage}.{block}.kcla.'
                f'{UNET_KCLA_MODULE_NAMES[module]}{rest}')
    match = _BLOCK_KEY.match(key)
    if match:
        stage, block, rest = match.groups()
        return f'backbone.layer{stage}.{block}.{rest}'
    match = _UP_KEY.match(key)
    if match and match.group(2) in DOUBLE_CONV_PARTS:
        step, index, rest = match.groups()
        conv, part = DOUBLE_CONV_PARTS[index]
        return (f'decode_head.up_steps.{int(step) - 1}.convs.{conv}.'
                f'{part}.{rest}')
    match = _OUT_KEY.match(key)
    if match:
        return f'decode_head.conv_seg.{match.group(1)}'
    raise OfficialCheckpointError(
        f'key {key!r} is not of the official UNet_kcla network')


def load_official_unet_state_dict(path: str) -> Dict[str, Tensor]:
    """The weights of an official UNet-KCLA checkpoint file: the
    ``best.pth`` the official ``train.py`` saves (a bare state dict) or its
    ``latest.pth`` (``model_state_dict`` beside the optimizer's), with or
    without DataParallel's ``module.`` prefix."""
    return read_official_weights(
        path, ('model_state_dict', 'state_dict'), lambda state: any(
            k.startswith('encoder.layer1.attention.') for k in state),
        "UNet_kcla checkpoint: it has no 'encoder.layer1.attention.*' keys")


def convert_official_unet_state_dict(
        state: Dict[str, Tensor],
        source: str = '<state_dict>') -> UNetConversionResult:
    """Converts the official UNet-KCLA weights ``state``; every official key
    is mapped (its shape checked) or reported in ``dropped``, and every
    tensor of the segmentor is filled.

    Args:
        state (dict): Official key -> tensor.
        source (str): What ``state`` came from, for the error messages.

    Raises:
        OfficialCheckpointError: naming the key, for a key of another
            network, a shape the segmentor does not have, or a tensor of
            the segmentor that the checkpoint lacks.
    """

    def unused(key: str, new_key: Optional[str]) -> Optional[str]:
        # encoder.bn2, and stage 1 block 0's adjust_channel (no incoming
        # state to adapt): what the official network builds and never
        # calls. Any other key without a counterpart is of another network.
        if _NEVER_USED_KEY.match(key):
            return NEVER_USED
        return None

    converted, dropped = map_official_tensors(
        state,
        build_unet_paper_target().state_dict(), official_unet_to_mm_key,
        unused, source, 'the UNet-KCLA segmentor', '.inv_tau')
    meta = dict(
        converted_from=osp.basename(source),
        converter='kcla_mm tools/model_converters/kcla_unet_official2mm.py',
        official_model='segmentation/models/UNet_kcla.py',
        config=UNET_CONFIG,
        official_outputs_need=dict(
            model=dict(backbone=dict(carry_state=False))),
        dropped_keys=sorted(dropped))
    return UNetConversionResult(converted, dropped, meta)


def convert_official_unet_checkpoint(path: str) -> UNetConversionResult:
    """Converts an official UNet-KCLA checkpoint file (see
    :func:`load_official_unet_state_dict` and
    :func:`convert_official_unet_state_dict`)."""
    return convert_official_unet_state_dict(
        load_official_unet_state_dict(path), path)
