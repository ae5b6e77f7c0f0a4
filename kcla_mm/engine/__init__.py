# Copyright (c) kcla_mm contributors. Licensed under the Apache License 2.0.
"""Training-loop additions registered in mmengine's registries."""
from .hooks import CheckpointMatchHook, RandomStateHook, state_dict_mismatch
from .wrap_policies import RESIDUAL_BLOCKS, residual_block_wrap_policy

__all__ = [
    'CheckpointMatchHook', 'RandomStateHook', 'RESIDUAL_BLOCKS',
    'residual_block_wrap_policy', 'state_dict_mismatch'
]
