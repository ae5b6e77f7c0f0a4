# Copyright (c) kcla_mm contributors. Licensed under the Apache License 2.0.
"""Training-loop additions registered in mmengine's registries."""
from .hooks import RandomStateHook

__all__ = ['RandomStateHook']
