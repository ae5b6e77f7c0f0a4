import logging
import os
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(autouse=True)
def _quiet_and_seeded():
    # mmengine logs one INFO record per parameter on init_weights().
    from mmengine.logging import MMLogger
    logger = MMLogger.get_current_instance()
    level = logger.level
    logger.setLevel(logging.WARNING)
    torch.manual_seed(0)
    yield
    logger.setLevel(level)


@pytest.fixture(autouse=True)
def _default_scope_restored():
    """What a test sets as mmengine's default scope (init_default_scope, a
    Runner) is undone after it: a registry builds from the current default
    scope's registry, so a scope left at 'mmseg' would make the next test's
    mmdet MODELS.build(dict(type='KCLAResNet')) build mmseg's class of that
    name. mmengine has no public call that drops a scope."""
    from mmengine.registry import DefaultScope
    scopes = DefaultScope._instance_dict.copy()
    yield
    DefaultScope._instance_dict.clear()
    DefaultScope._instance_dict.update(scopes)


@pytest.fixture(autouse=True)
def _thread_count_restored():
    """torch's intra-op thread count as it was before the test: a tool run
    in-process (profile_kcla.py's and depth_scaling.py's --threads default
    to 1) would otherwise leave every later test of the session on one
    thread, where its rounding differs from torch's default's."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def float64():
    """float64 as the default dtype, so that a difference between two
    implementations is one of math, not of rounding."""
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(torch.float32)


@pytest.fixture(scope='session')
def repo_root():
    return ROOT


@pytest.fixture(scope='session')
def ext():
    """The compiled kernels, which setup builds (gcc is on every CI
    machine); the modules that need them skip themselves where
    KCLA_MM_NO_EXTENSION is set."""
    from kcla_mm.models.layers.kcla import compiled
    module = compiled.extension()
    assert module is not None, (
        f'{compiled.extension_name()} is not built: run `make setup` '
        '(pip install --no-build-isolation -e .) with a C++ compiler')
    return module
