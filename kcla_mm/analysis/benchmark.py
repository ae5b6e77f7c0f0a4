# Copyright (c) kcla_mm contributors. Licensed under the Apache License 2.0.
"""KCLAResNet against mmdet's ResNet of the same depth: latency and the
activation memory of a train step.

Both models are measured in one run, alternating iteration by iteration
(:func:`kcla_mm.analysis.timing.alternating_times`) so that machine noise
hits both alike. Speed is a measurement, not a test: nothing here asserts.
"""
from typing import Dict, List, Sequence, Tuple

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


def build_models(depth: int,
                 device: str = 'cpu',
                 memory_format: torch.memory_format = torch.contiguous_format,
                 kcla_inplace: bool = False,
                 kcla_implementation: str = 'fused',
                 setting: str = 'bn') -> Dict[str, nn.Module]:
    """``{'resnet': ResNet, 'kcla': KCLAResNet}`` of ``depth``, initialised
    with seed 0 and moved to ``device`` in ``memory_format``; KCLAResNet's
    ``kcla_inplace`` and ``kcla_implementation`` as given.

    ``setting`` is one of :data:`TRAIN_SETTINGS`, the same for both; the
    default 'bn' (nothing frozen) makes a train step update BN statistics
    as in ImageNet training.
    """
    torch.manual_seed(0)
    common = dict(depth=depth, **TRAIN_SETTINGS[setting])
    models = {
        'resnet':
        ResNet(**common),
        'kcla':
        KCLAResNet(
            **common,
            kcla_inplace=kcla_inplace,
            kcla_implementation=kcla_implementation)
    }
    for model in models.values():
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
