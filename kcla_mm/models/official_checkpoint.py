# Copyright (c) kcla_mm contributors. Licensed under the Apache License 2.0.
"""Key mapping from the official KCLA ImageNet checkpoints to KCLAResNet."""
import os.path as osp
import re
from dataclasses import dataclass, field
from typing import Dict

import torch
from torch import Tensor

from .backbones import KCLAResNet

# official KCLA layer attribute -> KCLALayer attribute
KCLA_MODULE_NAMES = {
    'Wq': 'query_conv',
    'Wk': 'key_conv',
    'Wv': 'value_conv',
    'head_att': 'head_mix',
    'bn_attention': 'norm',
    'norm_d': 'tau',
    'adjust_channel': 'state_adapt',
    'u_Wk': 'state_key_conv',
    'u_bn': 'state_norm',
}
# Official modules that exist in blocks where the forward never calls them
# (stage 1 block 0 has no incoming state; block 11 keeps the width).
STATE_MODULES = ('adjust_channel', 'u_Wk', 'u_bn')

_BLOCK_KEY = re.compile(r'^layer(\d+)\.layers\.(\d+)\.(.+)$')
_KCLA_KEY = re.compile(r'^layer(\d+)\.attention\.(\d+)\.([^.]+)(.*)$')


class OfficialCheckpointError(ValueError):
    """The file is not an official KCLA ImageNet checkpoint we can map."""


@dataclass
class ConversionResult:
    depth: int
    state_dict: Dict[str, Tensor]
    dropped: Dict[str, str] = field(default_factory=dict)
    meta: dict = field(default_factory=dict)


def load_official_state_dict(path: str) -> Dict[str, Tensor]:
    """Loads the model weights of an official checkpoint (weights only)."""
    if not osp.isfile(path):
        raise OfficialCheckpointError(f'{path}: no such file')
    try:
        ckpt = torch.load(path, map_location='cpu', weights_only=True)
    except Exception as exc:
        raise OfficialCheckpointError(
            f'{path} is not a loadable torch checkpoint ({exc})') from exc
    if isinstance(ckpt, dict) and isinstance(ckpt.get('state_dict'), dict):
        state = ckpt['state_dict']
    elif isinstance(ckpt, dict):
        state = ckpt
    else:
        raise OfficialCheckpointError(
            f'{path} holds a {type(ckpt).__name__}, not a dict with '
            "'state_dict'")
    state = {
        (k[len('module.'):] if k.startswith('module.') else k): v
        for k, v in state.items()
    }
    if not any(k.startswith('layer1.attention.') for k in state):
        raise OfficialCheckpointError(
            f"{path} is not an official KCLA ImageNet checkpoint: it has no "
            "'layer1.attention.*' keys (found e.g. "
            f'{sorted(state)[:3]})')
    bad = [k for k, v in state.items() if not isinstance(v, Tensor)]
    if bad:
        raise OfficialCheckpointError(
            f'{path}: state_dict entries that are not tensors: {bad[:5]}')
    return state


def infer_depth(state: Dict[str, Tensor], path: str = '<state_dict>') -> int:
    blocks = {}
    for key in state:
        match = _BLOCK_KEY.match(key)
        if match:
            stage, block = int(match.group(1)), int(match.group(2))
            blocks[stage] = max(blocks.get(stage, 0), block + 1)
    stage_blocks = tuple(blocks.get(i, 0) for i in range(1, 5))
    for depth, (block, arch) in KCLAResNet.arch_settings.items():
        if block.expansion == 4 and tuple(arch) == stage_blocks:
            return depth
    raise OfficialCheckpointError(
        f'{path}: blocks per stage {stage_blocks} match no Bottleneck '
        'KCLAResNet depth (50: (3, 4, 6, 3), 101: (3, 4, 23, 3), '
        '152: (3, 8, 36, 3))')


def official_to_mm_key(key: str) -> str:
    """Maps one official key to its KCLAResNet name ('' for fc.*)."""
    if key.startswith('fc.'):
        return ''
    match = _BLOCK_KEY.match(key)
    if match:
        return f'layer{match.group(1)}.{match.group(2)}.{match.group(3)}'
    match = _KCLA_KEY.match(key)
    if match:
        stage, block, module, rest = match.groups()
        if module not in KCLA_MODULE_NAMES:
            raise OfficialCheckpointError(
                f'unknown KCLA module {module!r} in key {key!r}')
        return (f'layer{stage}.{block}.kcla.'
                f'{KCLA_MODULE_NAMES[module]}{rest}')
    return key  # stem: conv1.*, bn1.*


def convert_official_checkpoint(path: str) -> ConversionResult:
    """Converts an official checkpoint file; every official key is either
    mapped onto KCLAResNet or reported in ``dropped``."""
    state = load_official_state_dict(path)
    depth = infer_depth(state, path)
    target = KCLAResNet(depth=depth).state_dict()
    converted, dropped = {}, {}
    for key, value in state.items():
        new_key = official_to_mm_key(key)
        if not new_key:
            dropped[key] = 'ImageNet classifier head'
            continue
        if new_key not in target:
            match = _KCLA_KEY.match(key)
            if match and match.group(3) in STATE_MODULES:
                dropped[key] = 'never used by the official forward pass'
                continue
            raise OfficialCheckpointError(
                f'{path}: key {key!r} (-> {new_key!r}) has no counterpart in '
                f'KCLAResNet-{depth}')
        expected = target[new_key].shape
        if value.shape != expected:
            if value.numel() != expected.numel(
            ) or not new_key.endswith('.tau'):
                raise OfficialCheckpointError(
                    f'{path}: key {key!r} has shape {tuple(value.shape)}, '
                    f'KCLAResNet-{depth} expects {tuple(expected)} for '
                    f'{new_key!r}')
            value = value.reshape(expected)  # norm_d is (1, heads, 1, 1, 1)
        converted[new_key] = value.clone()
    missing = sorted(set(target) - set(converted))
    if missing:
        raise OfficialCheckpointError(
            f'{path}: KCLAResNet-{depth} keys missing from the checkpoint: '
            f'{missing[:10]}{" ..." if len(missing) > 10 else ""}')
    meta = dict(
        converted_from=osp.basename(path),
        converter='kcla_mm tools/model_converters/kcla_official2mm.py',
        depth=depth,
        dropped_keys=sorted(dropped))
    return ConversionResult(depth, converted, dropped, meta)
