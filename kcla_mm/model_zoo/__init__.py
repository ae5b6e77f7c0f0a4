# Copyright (c) kcla_mm contributors. Licensed under the Apache License 2.0.
"""kcla_mm's model zoo: model names and their configs and weights (the
model index), metafile entries, and publishing trained checkpoints.

Not imported by ``import kcla_mm``: import it (or its submodules) where it
is needed.
"""
from .metafile import metafile_entry
from .model_index import (ModelInfo, find_model, get_model_info, index_dir,
                          load_model_index)
from .publish import (CheckpointPublishError, load_training_checkpoint,
                      publish_checkpoint, release_name, sha256sum,
                      strip_checkpoint)

__all__ = [
    'CheckpointPublishError', 'ModelInfo', 'find_model', 'get_model_info',
    'index_dir', 'load_model_index', 'load_training_checkpoint',
    'metafile_entry', 'publish_checkpoint', 'release_name', 'sha256sum',
    'strip_checkpoint'
]
