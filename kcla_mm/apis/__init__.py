# Copyright (c) kcla_mm contributors. Licensed under the Apache License 2.0.
"""Using released kcla_mm models: names, configs, weights, inference."""
from ..engine.checkpoint_safety import allow_mmengine_checkpoint_types
from .inferencers import (KCLADetInferencer, KCLASegInferencer,
                          init_inferencer, resolve_model)
from .model_index import (ModelInfo, find_model, get_model_info, index_dir,
                          load_model_index)

# A kcla_mm config imports kcla_mm through custom_imports before mmengine's
# inferencers (DetInferencer, MMSegInferencer) load the weights with
# torch.load(weights_only=True). Registering the allow-list here lets training
# checkpoints (mmengine's HistoryBuffer logs) load there as well; it admits
# only those types, and weights_only stays on.
allow_mmengine_checkpoint_types()

__all__ = [
    'KCLADetInferencer', 'KCLASegInferencer', 'ModelInfo', 'find_model',
    'get_model_info', 'index_dir', 'init_inferencer', 'load_model_index',
    'resolve_model'
]
