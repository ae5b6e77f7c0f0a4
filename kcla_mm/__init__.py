# Copyright (c) kcla_mm contributors. Licensed under the Apache License 2.0.
"""KCLA for OpenMMLab.

Importing the package (what ``custom_imports = dict(imports=['kcla_mm'])``
does) registers the backbones in mmdet's and mmseg's MODELS (and in
mmpretrain's when the optional extra is installed), the UNet head and the
BCE + Dice loss in mmseg's MODELS, the medical datasets, the paper recipe's
transforms and the foreground-IoU and pooled pixel metrics in mmseg's
registries, :class:`~kcla_mm.engine.RandomStateHook` and
:class:`~kcla_mm.engine.CheckpointMatchHook` in mmengine's HOOKS (so in
every scope's), and allow-lists the types of mmengine training
checkpoints for ``torch.load(weights_only=True)``
(:mod:`kcla_mm.utils.checkpoint_safety`).
Nothing else: inferencers (:mod:`kcla_mm.apis`), the model zoo and the
analysis helpers load when they are imported.
"""
from . import datasets, engine, evaluation, models  # noqa: F401  registration
from .models import (KCLALayer, KCLAResNet, KCLAState, LAResNet,
                     MRLALightResNet, UNetHead)
from .utils.checkpoint_safety import allow_mmengine_checkpoint_types
from .version import __version__

# Once, here: upstream mmdet/mmseg tools (tools/test.py, --resume, the
# inferencers) load training checkpoints after custom_imports has imported
# kcla_mm, and on torch >= 2.6 they load them with weights_only=True.
allow_mmengine_checkpoint_types()

__all__ = [
    '__version__', 'KCLALayer', 'KCLAResNet', 'KCLAState', 'LAResNet',
    'MRLALightResNet', 'UNetHead'
]
