# Copyright (c) kcla_mm contributors. Licensed under the Apache License 2.0.
"""Key mapping from the official KCLA checkpoints (github bgx666/KCLA) to
kcla_mm's models.

Two official layouts: the ImageNet model (``imagenet/kcla_resnet.py``:
``layerN.layers.J.*``, ``layerN.attention.J.*``) maps onto
:class:`KCLAResNet`, the CIFAR model (``cifar/models/cifar/KCLA.py``:
``stages.I.J.*``, ``stages.I.J.kcla.*``) onto :class:`KCLAResNetCIFAR`.
Both map their ``fc`` onto the ``head.fc`` of an mmpretrain classifier
when the head is asked for.
"""
import os.path as osp
import re
from dataclasses import dataclass, field
from typing import Callable, Dict, Optional, Sequence, Tuple

from torch import Tensor

from ..utils.checkpoint_loading import (CheckpointError, CheckpointFileError,
                                        load_checkpoint, without_module_prefix)
from .backbones import KCLAResNet, KCLAResNetCIFAR
from .backbones.cifar_resnet import CIFAR_BLOCKS

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
# The CIFAR model: stages.I.J.<block module> and stages.I.J.kcla.<module>.
_CIFAR_KCLA_KEY = re.compile(r'^stages\.(\d+)\.(\d+)\.kcla\.([^.]+)(.*)$')
_CIFAR_BLOCK_KEY = re.compile(r'^stages\.(\d+)\.(\d+)\.(.+)$')

IMAGENET, CIFAR = 'imagenet', 'cifar'
# The classifier config each official model matches:
# (layout, depth, block, num_classes) -> config.
CLASSIFIER_CONFIGS = {
    (IMAGENET, 50, 'Bottleneck', 1000): 'configs/kcla/kcla-r50_8xb32_in1k.py',
    (IMAGENET, 101, 'Bottleneck', 1000):
    'configs/kcla/kcla-r101_8xb32_in1k.py',
    (CIFAR, 56, 'Bottleneck', 100): 'configs/kcla/kcla-r56_1xb128_cifar100.py',
    (CIFAR, 56, 'Bottleneck', 10): 'configs/kcla/kcla-r56_1xb128_cifar10.py',
}


class OfficialCheckpointError(ValueError):
    """The file is not an official KCLA checkpoint we can map."""


@dataclass
class ConversionResult:
    """A converted checkpoint.

    Attributes:
        depth (int): The network depth.
        state_dict (dict): The backbone's tensors (keys of ``backbone``),
            or the classifier's (``backbone.*``, ``head.fc.*``) when the
            head was asked for.
        dropped (dict): Official key -> why it has no counterpart.
        meta (dict): What the checkpoint was converted from, and the
            classifier config it matches (``config``, None when no config
            of the repository has that depth and class count).
        layout (str): ``'imagenet'`` or ``'cifar'``.
        block (str): ``'Bottleneck'`` or ``'BasicBlock'``.
        num_classes (int): Outputs of the official fc.
        backbone (str): The kcla_mm backbone type the keys are for.
    """
    depth: int
    state_dict: Dict[str, Tensor]
    dropped: Dict[str, str] = field(default_factory=dict)
    meta: dict = field(default_factory=dict)
    layout: str = IMAGENET
    block: str = 'Bottleneck'
    num_classes: int = 1000
    backbone: str = 'KCLAResNet'


def read_official_weights(path: str, wrappers: Sequence[str],
                          recognised: Callable[[Dict[str, Tensor]], bool],
                          expected: str) -> Dict[str, Tensor]:
    """The weights of an official checkpoint file (weights only), for the
    ImageNet / CIFAR and the UNet converters alike: the state dict found
    under the first of ``wrappers`` that the file holds (else the file's
    dict itself), without DataParallel's ``module.`` prefix.

    Raises:
        OfficialCheckpointError: a missing or unloadable file, one that
            holds no dict, whose keys ``recognised`` rejects (the message
            says ``expected``), or with entries that are not tensors.
    """
    try:
        # The official checkpoints hold only tensors and plain containers:
        # weights_only=True on every torch.
        ckpt = load_checkpoint(path, weights_only=True)
    except CheckpointFileError as exc:
        if exc.missing:
            raise OfficialCheckpointError(str(exc)) from None
        raise OfficialCheckpointError(
            f'{path} is not a loadable torch checkpoint ({exc.detail})'
        ) from None
    except CheckpointError as exc:  # non-finite tensors
        raise OfficialCheckpointError(str(exc)) from None
    if not isinstance(ckpt, dict):
        raise OfficialCheckpointError(
            f'{path} holds a {type(ckpt).__name__}, not a state dict')
    for wrapper in wrappers:
        if isinstance(ckpt.get(wrapper), dict):
            ckpt = ckpt[wrapper]
            break

    def official(entries: dict) -> bool:
        # Files may hold keys of any type (an optimizer's state by index).
        return recognised({
            k: v
            for k, v in entries.items() if isinstance(k, str)
        })

    state = without_module_prefix(ckpt)
    if not official(state):
        nested = [
            k for k, v in state.items()
            if isinstance(v, dict) and official(without_module_prefix(v))
        ]
        where = (
            f'; the weights are under {nested[0]!r}, which the converter '
            f'does not read (it reads a bare state dict or one under '
            f'{" or ".join(map(repr, wrappers))}): save that entry on its '
            f'own and convert the new file' if nested else '')
        raise OfficialCheckpointError(
            f'{path} is not an official {expected} (found e.g. '
            f'{sorted(map(str, state))[:3]}){where}')
    bad = [k for k, v in state.items() if not isinstance(v, Tensor)]
    if bad:
        raise OfficialCheckpointError(
            f'{path}: state_dict entries that are not tensors: {bad[:5]}')
    unnamed = [k for k in state if not isinstance(k, str)]
    if unnamed:
        raise OfficialCheckpointError(
            f'{path}: state_dict keys that are not parameter names: '
            f'{unnamed[:5]}')
    return state


def map_official_tensors(
    state: Dict[str, Tensor],
    target: Dict[str, Tensor],
    to_mm_key: Callable[[str], Optional[str]],
    unused: Callable[[str, Optional[str]], Optional[str]],
    source: str,
    name: str,
    reshapeable: str,
) -> Tuple[Dict[str, Tensor], Dict[str, str]]:
    """Maps official tensors onto a kcla_mm model's keys, for the ImageNet /
    CIFAR and the UNet converters alike: every official key is either
    mapped (its shape checked) or dropped with a reason, and every tensor of
    the model must be filled.

    Args:
        state (dict): Official key -> tensor.
        target (dict): The model's state dict (key -> tensor): the keys to
            fill and their shapes.
        to_mm_key (callable): Official key -> the model's key; None (or a
            key that ``target`` lacks) for a key with no counterpart. May
            raise :class:`OfficialCheckpointError` for a foreign key.
        unused (callable): (official key, what ``to_mm_key`` gave) -> why
            that key has no counterpart, or None when it should have one
            (an error).
        source (str): What ``state`` came from, for the error messages.
        name (str): The model, for the error messages.
        reshapeable (str): The ending of the model's keys whose tensor may
            come in another shape of as many elements (the official
            ``norm_d`` is ``(1, heads, 1, 1, 1)``); it is reshaped.

    Returns:
        tuple: The model's key -> tensor (a copy, in the model's shape), in
        the order of ``state``; and official key -> why it was dropped.

    Raises:
        OfficialCheckpointError: naming the key, for a key of another
            network, one with no counterpart that ``unused`` does not
            excuse, a shape the model does not have; or naming the model's
            keys that the checkpoint lacks.
    """
    converted, dropped = {}, {}
    for key, value in state.items():
        try:
            new_key = to_mm_key(key)
        except OfficialCheckpointError as exc:
            raise OfficialCheckpointError(f'{source}: {exc}') from None
        if new_key is None or new_key not in target:
            reason = unused(key, new_key)
            if reason is None:
                raise OfficialCheckpointError(
                    f'{source}: key {key!r} (-> {new_key!r}) has no '
                    f'counterpart in {name}')
            dropped[key] = reason
            continue
        expected = target[new_key].shape
        if value.shape != expected:
            if not (new_key.endswith(reshapeable)
                    and value.numel() == expected.numel()):
                raise OfficialCheckpointError(
                    f'{source}: key {key!r} has shape {tuple(value.shape)}, '
                    f'{name} expects {tuple(expected)} for {new_key!r}')
            value = value.reshape(expected)
        converted[new_key] = value.clone()
    missing = sorted(set(target) - set(converted))
    if missing:
        raise OfficialCheckpointError(
            f'{source}: {name} keys missing from the checkpoint: '
            f'{missing[:10]}{" ..." if len(missing) > 10 else ""}')
    return converted, dropped


def load_official_state_dict(path: str) -> Dict[str, Tensor]:
    """Loads the model weights of an official checkpoint (weights only)."""
    return read_official_weights(
        path, ('state_dict', ), lambda state: layout_of(state) is not None,
        "KCLA checkpoint: it has no 'layer1.attention.*' keys (ImageNet "
        "model) and no 'stages.0.0.kcla.*' keys (CIFAR model)")


def layout_of(state: Dict[str, Tensor]) -> Optional[str]:
    """``'imagenet'``, ``'cifar'`` or None: which official model the keys
    are of."""
    if any(k.startswith('layer1.attention.') for k in state):
        return IMAGENET
    if any(k.startswith('stages.0.0.kcla.') for k in state):
        return CIFAR
    return None


def infer_cifar_arch(state: Dict[str, Tensor],
                     path: str = '<state_dict>') -> Tuple[int, str]:
    """(depth, block name) of an official CIFAR model's keys: n blocks per
    stage; Bottleneck blocks have a conv3."""
    blocks = {}
    for key in state:
        match = _CIFAR_BLOCK_KEY.match(key)
        if match:
            stage, block = int(match.group(1)), int(match.group(2))
            blocks[stage] = max(blocks.get(stage, 0), block + 1)
    stage_blocks = tuple(blocks.get(i, 0) for i in range(3))
    if len(blocks) != 3 or len(set(stage_blocks)) != 1 or not stage_blocks[0]:
        raise OfficialCheckpointError(
            f'{path}: blocks per stage {tuple(sorted(blocks.items()))} are '
            'not the three equal stages of the official CIFAR ResNet')
    block = ('Bottleneck'
             if 'stages.0.0.conv3.weight' in state else 'BasicBlock')
    return CIFAR_BLOCKS[block][1] * stage_blocks[0] + 2, block


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


def _kcla_module_key(key: str) -> Optional[Tuple[int, str, str, str]]:
    """(stage from 1, block, official module, rest) of a KCLA layer key of
    either layout; None for other keys."""
    match = _KCLA_KEY.match(key)
    if match:
        stage, block, module, rest = match.groups()
        return int(stage), block, module, rest
    match = _CIFAR_KCLA_KEY.match(key)
    if match:
        stage, block, module, rest = match.groups()
        return int(stage) + 1, block, module, rest
    return None


def built_but_unused(key: str, target: Dict[str, Tensor]) -> bool:
    """Whether ``key`` is of a state module (Algorithm 1's) that the
    official model builds where its forward pass never calls it: all three
    at the first block of stage 1 (no incoming state), and the
    ``adjust_channel`` of a re-normalisation that keeps the state's width
    (ResNet-101's stage-3 block 11), where ``target``, the kcla_mm
    backbone's state dict, renormalises without an adapter. Any other
    state-module key is of a model the converter does not know."""
    kcla = _kcla_module_key(key)
    if kcla is None or kcla[2] not in STATE_MODULES:
        return False
    stage, block, module, _ = kcla
    if stage == 1 and block == '0':
        return True
    norm = KCLA_MODULE_NAMES['u_bn']
    return (module == 'adjust_channel'
            and f'layer{stage}.{block}.kcla.{norm}.weight' in target)


def official_to_mm_key(key: str) -> str:
    """Maps one official key (either layout) to its name in the kcla_mm
    backbone ('' for fc.*)."""
    if key.startswith('fc.'):
        return ''
    kcla = _kcla_module_key(key)
    if kcla:
        stage, block, module, rest = kcla
        if module not in KCLA_MODULE_NAMES:
            raise OfficialCheckpointError(
                f'unknown KCLA module {module!r} in key {key!r}')
        return (f'layer{stage}.{block}.kcla.'
                f'{KCLA_MODULE_NAMES[module]}{rest}')
    match = _BLOCK_KEY.match(key)
    if match:
        return f'layer{match.group(1)}.{match.group(2)}.{match.group(3)}'
    match = _CIFAR_BLOCK_KEY.match(key)
    if match:
        stage, block, rest = match.groups()
        return f'layer{int(stage) + 1}.{block}.{rest}'
    return key  # stem: conv1.*, bn1.*


def convert_official_checkpoint(path: str,
                                with_head: bool = False) -> ConversionResult:
    """Converts an official checkpoint file (ImageNet or CIFAR model); every
    official key is either mapped or reported in ``dropped``.

    Args:
        path (str): The official checkpoint (``module.``-prefixed keys and
            a ``{'state_dict': ...}`` wrapper are accepted).
        with_head (bool): Also map the official ``fc`` onto the
            ``head.fc`` of the matching mmpretrain classifier, with keys
            ``backbone.*`` and ``head.fc.*``. Defaults to False (the
            backbone's keys only; ``fc.*`` is reported as dropped).
    """
    state = load_official_state_dict(path)
    layout = layout_of(state)
    if layout == IMAGENET:
        depth, block = infer_depth(state, path), 'Bottleneck'
        backbone = KCLAResNet(depth=depth)
    else:
        depth, block = infer_cifar_arch(state, path)
        backbone = KCLAResNetCIFAR(depth=depth, block=block)
    name = f'{type(backbone).__name__}-{depth}'
    target = backbone.state_dict()
    for key in ('fc.weight', 'fc.bias'):
        if key not in state:
            raise OfficialCheckpointError(
                f"{path}: no '{key}' (the official classifier head)")
    num_classes = state['fc.weight'].shape[0]

    def unused(key: str, new_key: Optional[str]) -> Optional[str]:
        if not new_key:  # fc.*
            return 'classifier head (use --with-head to keep it)'
        if built_but_unused(key, target):
            return 'never used by the official forward pass'
        return None

    # with the head, fc.* becomes head.fc.*, the rest backbone.*
    head = [k for k in state if with_head and k.startswith('fc.')]
    backbone_state = {k: v for k, v in state.items() if k not in head}
    converted, dropped = map_official_tensors(backbone_state, target,
                                              official_to_mm_key, unused, path,
                                              name, '.tau')
    if with_head:
        converted = {f'backbone.{k}': v for k, v in converted.items()}
        converted.update((f'head.{k}', state[k].clone()) for k in head)
    config = CLASSIFIER_CONFIGS.get((layout, depth, block, num_classes))
    meta = dict(
        converted_from=osp.basename(path),
        converter='kcla_mm tools/model_converters/kcla_official2mm.py',
        official_model=layout,
        backbone=type(backbone).__name__,
        depth=depth,
        block=block,
        num_classes=int(num_classes),
        # The classifier config loads only the file with the head: the
        # backbone's keys lack its 'backbone.' prefix.
        config=config if with_head else None,
        dropped_keys=sorted(dropped))
    return ConversionResult(depth, converted, dropped, meta, layout, block,
                            int(num_classes),
                            type(backbone).__name__)
