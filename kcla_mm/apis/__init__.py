# Copyright (c) kcla_mm contributors. Licensed under the Apache License 2.0.
"""Inference with kcla_mm models, by config or by model name.

The model-index functions are re-exported for convenience; their home is
:mod:`kcla_mm.model_zoo`.
"""
from ..model_zoo.model_index import (ModelInfo, find_model, get_model_info,
                                     index_dir, load_model_index)
from .inferencers import (KCLADetInferencer, KCLASegInferencer,
                          init_inferencer, resolve_model)

__all__ = [
    'KCLADetInferencer', 'KCLASegInferencer', 'ModelInfo', 'find_model',
    'get_model_info', 'index_dir', 'init_inferencer', 'load_model_index',
    'resolve_model'
]
