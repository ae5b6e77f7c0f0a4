# Copyright (c) kcla_mm contributors. Licensed under the Apache License 2.0.
"""Helpers around mmengine: reading a config for a run
(:mod:`.config`), distributed runs without GPUs (:mod:`.distributed`),
checkpoint safety (:mod:`.checkpoint_safety`). Import the submodules you
need; this package imports nothing itself, so that ``import kcla_mm`` stays
cheap."""
