# Copyright (c) kcla_mm contributors. Licensed under the Apache License 2.0.
from .checkpoint_match_hook import CheckpointMatchHook, state_dict_mismatch
from .random_state_hook import (RandomStateHook, epoch_worker_seed,
                                get_random_state, set_random_state)

__all__ = [
    'CheckpointMatchHook', 'RandomStateHook', 'epoch_worker_seed',
    'get_random_state', 'set_random_state', 'state_dict_mismatch'
]
