# Copyright (c) kcla_mm contributors. Licensed under the Apache License 2.0.
"""Using released kcla_mm models: names, configs, weights, inference."""
from .inferencers import (KCLADetInferencer, KCLASegInferencer,
                          init_inferencer, resolve_model)
from .model_index import (ModelInfo, find_model, get_model_info, index_dir,
                          load_model_index)

__all__ = [
    'KCLADetInferencer', 'KCLASegInferencer', 'ModelInfo', 'find_model',
    'get_model_info', 'index_dir', 'init_inferencer', 'load_model_index',
    'resolve_model'
]
