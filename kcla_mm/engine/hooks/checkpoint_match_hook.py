# Copyright (c) kcla_mm contributors. Licensed under the Apache License 2.0.
"""A test that refuses a checkpoint whose weights are not the model's.

mmengine's Runner loads ``load_from`` with ``strict=False``: a file whose
keys do not match the model (a backbone's checkpoint given for a whole
detector, a model of another depth) loads nothing or part of it, with a
warning in the log, and the test then reports the metrics of an
initialised model and exits 0. ``tools/test.py`` adds
:class:`CheckpointMatchHook`, which refuses such a file before the test
runs.
"""
import re
from typing import Dict, List, Optional

from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper
from mmengine.registry import HOOKS
from mmengine.runner import Runner
from torch import Tensor

from ...utils.checkpoint_loading import CheckpointError

#: The prefix mmengine's Runner.load_checkpoint strips (DataParallel's).
_MODULE_PREFIX = re.compile(r'^module\.')


def _listed(keys: List[str], limit: int = 3) -> str:
    more = f' and {len(keys) - limit} more' if len(keys) > limit else ''
    return ', '.join(keys[:limit]) + more


def state_dict_mismatch(model_state: Dict[str, Tensor],
                        file_state: Dict[str, Tensor]) -> Optional[str]:
    """What keeps ``file_state`` from being exactly the weights of the model
    with ``model_state`` (missing and unexpected keys, other shapes), or
    None; with a hint where the file is a backbone's alone."""
    file_state = {_MODULE_PREFIX.sub('', k): v for k, v in file_state.items()}
    missing = [k for k in model_state if k not in file_state]
    unexpected = [k for k in file_state if k not in model_state]
    shapes = [
        f'{k} {tuple(file_state[k].shape)} (the model: '
        f'{tuple(model_state[k].shape)})' for k in model_state
        if k in file_state and hasattr(file_state[k], 'shape')
        and file_state[k].shape != model_state[k].shape
    ]
    if not (missing or unexpected or shapes):
        return None
    parts = []
    if missing:
        parts.append(f'{len(missing)} missing: {_listed(missing)}')
    if unexpected:
        parts.append(f'{len(unexpected)} keys the model lacks: '
                     f'{_listed(unexpected)}')
    if shapes:
        parts.append(f'{len(shapes)} of other shapes: {_listed(shapes, 2)}')
    message = ('it does not hold the weights of this model '
               f'({len(model_state)} tensors): ' + '; '.join(parts))
    if unexpected and all(f'backbone.{k}' in model_state for k in unexpected):
        message += (" (a backbone's checkpoint, e.g. of kcla_official2mm.py "
                    'without --with-head: it initialises a model to train, '
                    "through model.backbone.init_cfg=dict(type='Pretrained', "
                    'checkpoint=...); convert with --with-head for a '
                    'classifier to test)')
    return message


@HOOKS.register_module()
class CheckpointMatchHook(Hook):
    """Refuses, as mmengine's Runner loads ``load_from``, a checkpoint that
    does not hold exactly the model's tensors (keys and shapes), with a
    :class:`~kcla_mm.utils.checkpoint_loading.CheckpointError` naming the
    file and the first keys.

    Used by ``tools/test.py``; in a config::

        custom_hooks = [dict(type='CheckpointMatchHook', checkpoint=PATH)]

    It checks under mmengine's ``Runner`` (also with DDP); other runners
    (``FlexibleRunner``, whose strategies may shard the model) load as
    mmengine does.

    Args:
        checkpoint (str): The file, for the message.
    """

    priority = 'VERY_LOW'

    def __init__(self, checkpoint: str):
        self.checkpoint = str(checkpoint)

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        if not isinstance(runner, Runner):
            return
        model = runner.model.module if is_model_wrapper(
            runner.model) else runner.model
        file_state = checkpoint.get('state_dict', checkpoint)
        problem = state_dict_mismatch(model.state_dict(), file_state)
        if problem is not None:
            raise CheckpointError(self.checkpoint, problem)
