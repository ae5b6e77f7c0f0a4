"""Helpers shared by the test modules (fixtures live in conftest.py)."""
import importlib.util
import os.path as osp
import socket
import struct
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


def dynamic_symbols(path):
    """(defined, undefined): the names in an ELF64 little-endian shared
    object's dynamic symbol table (what `nm -D` lists), versions dropped."""
    with open(path, 'rb') as f:
        data = f.read()
    assert data[:4] == b'\x7fELF' and data[4] == 2 and data[5] == 1, (
        f'{path} is not an ELF64 little-endian file')
    shoff, = struct.unpack_from('<Q', data, 0x28)
    shentsize, shnum = struct.unpack_from('<HH', data, 0x3A)
    sections = [
        struct.unpack_from('<IIQQQQIIQQ', data, shoff + i * shentsize)
        for i in range(shnum)
    ]
    defined, undefined = set(), set()
    for _, kind, _, _, offset, size, link, _, _, entsize in sections:
        if kind != 11:  # SHT_DYNSYM
            continue
        strtab = sections[link][4]
        for pos in range(offset + entsize, offset + size, entsize):
            name_at, _, _, shndx = struct.unpack_from('<IBBH', data, pos)
            end = data.index(b'\0', strtab + name_at)
            name = data[strtab + name_at:end].decode()
            (defined if shndx else undefined).add(name)
    return defined, undefined
