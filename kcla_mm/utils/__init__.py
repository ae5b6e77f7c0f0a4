# Copyright (c) kcla_mm contributors. Licensed under the Apache License 2.0.
"""Helpers around mmengine: config loading, checkpoint safety, distributed
runs without GPUs. Import the submodules you need; this package imports
nothing itself, so that ``import kcla_mm`` stays cheap."""
