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
