# Copyright (c) kcla_mm contributors. Licensed under the Apache License 2.0.
"""KCLAResNet against mmdet's ResNet of the same depth: latency and the
activation memory of a train step.

Both models are measured in one run, alternating iteration by iteration
(:func:`kcla_mm.analysis.timing.alternating_times`) so that machine noise
hits both alike. Speed is a measurement, not a test: nothing here asserts.
"""
import importlib.util
import os.path as osp
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
from mmdet.models.backbones import ResNet
from torch import Tensor

from ..models import KCLAResNet
from .complexity import saved_activation_bytes
from .timing import alternating_times, eval_step, train_step

MODES = ('eval', 'train')

#: The two train settings of the memory targets: ImageNet training (every
#: BN learns and updates its statistics) and mmdet's detection backbones
#: (stage 1 frozen, BN statistics frozen).
TRAIN_SETTINGS = {
    'bn': dict(norm_eval=False, frozen_stages=-1),
    'detection': dict(norm_eval=True, frozen_stages=1),
}


def load_official(path: str, depth: int) -> nn.Module:
    """The official ImageNet KCLA-ResNet of ``depth`` from the user's copy
    of its file (github bgx666/KCLA ``imagenet/kcla_resnet.py``, which
    needs only torch), with its fc replaced by the identity: the
    comparison is of backbones (the average pool stays, a few
    microseconds)."""
    if not osp.isfile(path):
        raise FileNotFoundError(f'--official {path}: no such file')
    spec = importlib.util.spec_from_file_location('official_kcla_resnet', path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    name = f'resnet{depth}_kcla'
    if not hasattr(module, name):
        found = sorted(n for n in vars(module) if n.endswith('_kcla'))
        raise ValueError(f'--official {path} has no {name}() for depth '
                         f'{depth} (it has: {", ".join(found) or "none"})')
    model = getattr(module, name)()
    if isinstance(getattr(model, 'fc', None), nn.Module):
        model.fc = nn.Identity()
    return model


def build_models(depth: int,
                 device: str = 'cpu',
                 memory_format: torch.memory_format = torch.contiguous_format,
                 kcla_implementation: str = 'auto',
                 setting: str = 'bn',
                 official: Optional[str] = None) -> Dict[str, nn.Module]:
    """``{'resnet': ResNet, 'kcla': KCLAResNet}`` of ``depth``, initialised
    with seed 0 and moved to ``device`` in ``memory_format``; KCLAResNet's
    ``kcla_implementation`` as given.

    ``setting`` is one of :data:`TRAIN_SETTINGS`, the same for both; the
    default 'bn' (nothing frozen) makes a train step update BN statistics
    as in ImageNet training. With ``official`` (a path, see
    :func:`load_official`) and the 'bn' setting, the official model is
    added as ``'official'`` (it has no frozen stages or frozen BN).
    """
    torch.manual_seed(0)
    common = dict(depth=depth, **TRAIN_SETTINGS[setting])
    models = {
        'resnet': ResNet(**common),
        'kcla': KCLAResNet(**common, kcla_implementation=kcla_implementation)
    }
    if official is not None and setting == 'bn':
        models['official'] = load_official(official, depth)
    for model in models.values():
        if hasattr(model, 'init_weights'):  # the official model inits itself
            model.init_weights()
        model.to(device, memory_format=memory_format)
    return models


def time_modes(models: Dict[str, nn.Module],
               x_eval: Tensor,
               x_train: Tensor,
               modes: Sequence[str] = MODES,
               warmup: int = 3,
               repeats: int = 15,
               device: str = 'cpu') -> Dict[Tuple[str, str], List[float]]:
    """Seconds per iteration of each (model name, mode).

    One mode at a time, so that eval rounds do not run between train
    steps; within a mode the models alternate.

    Args:
        models (dict[str, nn.Module]): The models by name.
        x_eval (Tensor): Input of an eval forward.
        x_train (Tensor): Input of a train step (forward and backward).
        modes (Sequence[str]): ``'eval'`` and/or ``'train'``.
        warmup (int): Untimed rounds per mode. Defaults to 3.
        repeats (int): Timed rounds per mode. Defaults to 15.
        device (str): The models' device; CUDA is synchronised around
            each step.

    Returns:
        dict[tuple[str, str], list[float]]: ``repeats`` times for each
        (model name, mode).
    """
    steps = {'eval': eval_step(x_eval), 'train': train_step(x_train)}
    results: Dict[Tuple[str, str], List[float]] = {}
    for mode in MODES:
        if mode in modes:
            results.update(
                alternating_times(models, {mode: steps[mode]}, warmup, repeats,
                                  device))
    return results


def train_step_memory(models: Dict[str, nn.Module],
                      x_train: Tensor,
                      device: str = 'cpu') -> Dict[str, int]:
    """Activation bytes of one train step of each model
    (:func:`kcla_mm.analysis.complexity.saved_activation_bytes`) and, on
    CUDA, the peak allocated bytes as ``<name>_peak``."""
    cuda = device.startswith('cuda')
    memory = {}
    for name, model in models.items():
        model.train()
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        memory[name] = saved_activation_bytes(model, x_train)
        if cuda:
            memory[name + '_peak'] = torch.cuda.max_memory_allocated()
    return memory
