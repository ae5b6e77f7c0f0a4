"""Helpers shared by the test modules (fixtures live in conftest.py)."""
import importlib.util
import os
import os.path as osp
import socket
import subprocess
from types import ModuleType

import pytest
import torch

from kcla_mm.models.layers import KCLAState

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))

# mmpretrain is the optional pretrain extra: it imports torchvision, which
# the main stack (CPU torch 2.13) cannot load. CI installs it in the torch
# 2.1.2 stack, where these tests run (test_install checks it is there).
HAS_MMPRETRAIN = importlib.util.find_spec('mmpretrain') is not None
requires_mmpretrain = pytest.mark.skipif(
    not HAS_MMPRETRAIN,
    reason=f'mmpretrain (the pretrain extra) is not installed with torch '
    f'{torch.__version__}; these tests run in the torch 2.1.2 stack '
    '(make test-compat)')


def run(*args,
        env=None,
        check=True,
        timeout=900) -> subprocess.CompletedProcess:
    """Runs a command in the repository root, as a user runs the tools;
    with ``check``, a failure shows the end of its output."""
    result = subprocess.run([str(a) for a in args],
                            cwd=ROOT,
                            capture_output=True,
                            text=True,
                            env=env,
                            timeout=timeout)
    if check:
        assert result.returncode == 0, (
            result.stdout[-3000:] + result.stderr[-3000:])
    return result


def output_of(*args, **kwargs) -> str:
    """stdout + stderr of a command that must succeed (see :func:`run`)."""
    result = run(*args, check=True, **kwargs)
    return result.stdout + result.stderr


def load_tool(relative: str) -> ModuleType:
    """A tool script as a module, so that its main() runs in-process."""
    name = 'tool_' + osp.splitext(osp.basename(relative))[0]
    spec = importlib.util.spec_from_file_location(name,
                                                  osp.join(ROOT, relative))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def small_backbone(cls, depth: int = 18, **kwargs):
    """A narrow layer-attention ResNet for wiring tests (the medical-UNet
    setting): base_channels 16, head_dim 8 unless given."""
    kwargs.setdefault('base_channels', 16)
    kwargs.setdefault('head_dim', 8)
    return cls(depth=depth, **kwargs)


def assert_close_to_max(ours, ref, tol: float, rtol: float = None) -> None:
    """Close within ``tol`` of the largest entry of ``ref``: the KCLA state
    sums layer weights up to e^10, so entries span many magnitudes."""
    torch.testing.assert_close(
        ours,
        ref,
        rtol=tol if rtol is None else rtol,
        atol=tol * ref.abs().max().item())


def incoming_state(case: str, n: int):
    """The state a 256-channel, 9x7 KCLA layer receives in ``case``:
    none for 'first', 128 channels at 17x13 for 'adapt' (Algorithm 1 with
    a conv), 256 channels at 9x7 otherwise; 4 heads of 64."""
    if case == 'first':
        return None
    c_in, size = (128, (17, 13)) if case == 'adapt' else (256, (9, 7))
    return KCLAState(
        torch.rand(n, c_in, *size) * 5,
        torch.rand(n, c_in // 64) + 0.5)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now, for a distributed test run."""
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def skip_module_without_extension(why: str) -> None:
    """Skip the calling test module where ``KCLA_MM_NO_EXTENSION`` is set
    (an install without the C++ kernels); ``why`` says what needs them."""
    if os.environ.get('KCLA_MM_NO_EXTENSION', '0') not in ('', '0'):
        pytest.skip(
            'KCLA_MM_NO_EXTENSION is set: kcla_mm was installed without its '
            f'C++ kernels, {why}',
            allow_module_level=True)
