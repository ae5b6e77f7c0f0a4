# Copyright (c) kcla_mm contributors. Licensed under the Apache License 2.0.
"""The OpenMMLab registries that kcla_mm's backbones go into.

mmdet and mmseg are requirements; mmpretrain is an optional extra
(``pip install kcla_mm[pretrain]``): it needs torchvision, which not every
torch build has. When it is installed, the backbones are in its MODELS too,
so that classification configs (``default_scope='mmpretrain'``) name them.
"""
import importlib.util
import warnings
from functools import lru_cache
from typing import Callable, List, Optional, Sequence, Union

from mmdet.registry import MODELS as MMDET_MODELS
from mmengine.registry import Registry
from mmseg.registry import MODELS as MMSEG_MODELS


@lru_cache(maxsize=None)
def mmpretrain_models() -> Optional[Registry]:
    """mmpretrain's MODELS registry, or None where mmpretrain is not
    installed.

    An installed mmpretrain that fails to import (e.g. a torchvision built
    for another torch) gives a warning with the reason rather than an error:
    detection and segmentation do not need it.
    """
    if importlib.util.find_spec('mmpretrain') is None:
        return None
    try:
        from mmpretrain.registry import MODELS
    except Exception as exc:  # noqa: B902  any import-time failure
        warnings.warn(
            f'mmpretrain is installed but cannot be imported ({exc!r}); '
            'the kcla_mm backbones are not registered in mmpretrain',
            stacklevel=2)
        return None
    return MODELS


def register_backbone(
    name: Union[str, Sequence[str], None] = None,
    registries: Sequence[str] = ('mmdet', 'mmseg', 'mmpretrain')
) -> Callable[[type], type]:
    """A class decorator that registers one backbone class under ``name``
    (default: the class name) in the MODELS registry of each of
    ``registries`` (mmpretrain's only when it is importable), so that
    configs of each codebase name it under their own ``default_scope``."""
    targets: List[Registry] = []
    for codebase in registries:
        if codebase == 'mmdet':
            targets.append(MMDET_MODELS)
        elif codebase == 'mmseg':
            targets.append(MMSEG_MODELS)
        elif codebase == 'mmpretrain':
            registry = mmpretrain_models()
            if registry is not None:
                targets.append(registry)
        else:
            raise ValueError(f"registries: unknown codebase {codebase!r}; "
                             "expected 'mmdet', 'mmseg' or 'mmpretrain'")

    def register(cls: type) -> type:
        for registry in targets:
            registry.register_module(name=name, module=cls)
        return cls

    return register
