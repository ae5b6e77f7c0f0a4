"""Helpers shared by the test modules (fixtures live in conftest.py)."""
import importlib.util
import os
import os.path as osp
import socket
import stat
import struct
import subprocess
from types import ModuleType
from typing import Callable, List

import pytest
import torch
from torch import Tensor

from kcla_mm.models import KCLAResNet
from kcla_mm.models.layers import KCLALayer, KCLAState
from official_reference import randomise_

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


def assert_usage_error(relative: str, argv, message: str, capsys) -> None:
    """The tool's ``parse_args(argv)`` exits as argparse does on a bad
    option (status 2) with ``message`` on stderr."""
    with pytest.raises(SystemExit) as error:
        load_tool(relative).parse_args(argv)
    assert error.value.code == 2
    assert message in capsys.readouterr().err


def small_backbone(cls, depth: int = 18, **kwargs):
    """A narrow layer-attention ResNet for wiring tests (the medical-UNet
    setting): base_channels 16, head_dim 8 unless given."""
    kwargs.setdefault('base_channels', 16)
    kwargs.setdefault('head_dim', 8)
    return cls(depth=depth, **kwargs)


def small_kcla(implementation: str) -> KCLAResNet:
    """A narrow KCLA-ResNet-18 (base 16, head_dim 16, no drop path, BN
    training) with the same weights at every call, for wrapping tests."""
    torch.manual_seed(0)
    return small_backbone(
        KCLAResNet,
        head_dim=16,
        kcla_drop_path=0.,
        norm_eval=False,
        kcla_implementation=implementation)


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


def adapter_case(stride: int, n: int, u_high: float = 5., z_high: float = 1.):
    """A randomised 256-channel layer whose Algorithm 1 adapts a 128-channel
    state at ``stride`` over odd sizes (17x13), with conv groups that split
    the incoming heads (32 of a 64-channel head), and that state (U in
    [0, ``u_high``), Z in [0.5, 0.5 + ``z_high``))."""
    layer = randomise_(
        KCLALayer(256, renorm=True, state_channels=128, state_stride=stride))
    assert layer.state_adapt.groups == 4
    state = KCLAState(
        torch.rand(n, 128, 17, 13) * u_high,
        torch.rand(n, 2) * z_high + 0.5)
    return layer, state


NORMS = {'BN': dict(type='BN'), 'GN': dict(type='GN', num_groups=4)}


def make_case(case, n=3, norm='BN', drop_path=0., zero_init_branch=False):
    """A randomised layer, its input and its incoming state.

    'adapt' changes width 128 -> 256 and size 17x13 -> 9x7 (Algorithm 1
    with a conv); 'renorm' re-normalises without one; 'first' has no state.
    """
    kwargs = dict(state_channels=128, state_stride=2) \
        if case == 'adapt' else {}
    layer = randomise_(
        KCLALayer(
            256,
            renorm=case in ('adapt', 'renorm'),
            norm_cfg=NORMS[norm],
            drop_path=drop_path,
            zero_init_branch=zero_init_branch,
            **kwargs))
    x = torch.rand(n, 256, 9, 7)
    state = incoming_state(case, n)
    return layer, x, state


def gradients(outputs, inputs, grad_outputs):
    """d(outputs . grad_outputs) / d(inputs); zeros for unused inputs."""
    grads = torch.autograd.grad(
        outputs, inputs, grad_outputs, allow_unused=True)
    return [
        torch.zeros_like(i) if g is None else g for i, g in zip(inputs, grads)
    ]


def assert_same_values_and_gradients(ours,
                                     refs,
                                     inputs,
                                     layer,
                                     tol: float = 1e-12,
                                     grad_tol: float = 1e-8):
    """Outputs within ``tol`` and the gradients with respect to ``inputs``
    and every parameter of ``layer`` within ``grad_tol`` (of the largest
    entry); the defaults are float64's."""
    for a, b in zip(ours, refs):
        assert_close_to_max(a, b, tol)
    grads = [torch.randn_like(t) for t in refs]
    params = list(inputs) + list(layer.parameters())
    for a, b in zip(
            gradients(ours, params, grads), gradients(refs, params, grads)):
        assert_close_to_max(a, b, grad_tol)


def pair(depth, drop_path=0.3, implementation='recompute', **kwargs):
    """Randomised reference and ``implementation`` backbones with equal
    weights."""
    common = dict(
        depth=depth,
        base_channels=8,
        head_dim=8,
        kcla_drop_path=drop_path,
        **kwargs)
    reference = randomise_(
        KCLAResNet(kcla_implementation='reference', **common))
    ours = KCLAResNet(kcla_implementation=implementation, **common)
    ours.load_state_dict(reference.state_dict())
    return reference, ours


def train_step(model, x, grad_outputs, seed=3):
    """Outputs, and gradients of (x, *parameters), of one train step
    (``backward()``: mmdet's with_cp blocks use a reentrant checkpoint,
    which ``autograd.grad`` cannot go through)."""
    model.train()
    model.zero_grad()
    x.grad = None
    torch.manual_seed(seed)  # the same drop-path masks for both models
    outs = model(x)
    sum((o * g).sum() for o, g in zip(outs, grad_outputs)).backward()
    params = [x] + [p for p in model.parameters() if p.requires_grad]
    return outs, [p.grad for p in params]


# fp16/bf16 against fp32, relative to the largest output of the fp32 run:
# about ten roundings of the format (eps 9.8e-4 and 7.8e-3). Measured (CPU,
# tests/test_half_precision.py): below 2e-3 and 1.3e-2.
HALF_TOL = {torch.float16: 1e-2, torch.bfloat16: 5e-2}


def assert_finite_and_close(outputs, expected, dtype: torch.dtype) -> None:
    for out, ref in zip(outputs, expected):
        assert torch.isfinite(out).all(), 'non-finite output'
        assert_close_to_max(out.float(), ref.float(), HALF_TOL[dtype])


def assert_finite_grads(model: torch.nn.Module, inputs: List[Tensor]) -> None:
    grads = [t.grad for t in inputs]
    grads += [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(g is not None for g in grads)
    assert all(torch.isfinite(g).all() for g in grads), 'non-finite gradient'


def squares(outputs) -> Tensor:
    """A loss over every output, in fp32."""
    return sum(o.float().square().mean() for o in outputs)


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


def assert_written_with_open_mode(write: Callable[[], str], umask: int,
                                  scratch) -> None:
    """``write()`` (which returns the path it wrote), run under ``umask``,
    leaves a file with the mode a plain ``open()`` gives a new file there
    (``0o666`` less the umask), compared with one made in ``scratch``."""
    old = os.umask(umask)
    try:
        written = write()
        with open(osp.join(scratch, 'plain'), 'w'):
            pass
    finally:
        os.umask(old)
    mode = stat.S_IMODE(os.stat(written).st_mode)
    assert oct(mode) == oct(0o666 & ~umask)
    assert mode == stat.S_IMODE(os.stat(osp.join(scratch, 'plain')).st_mode)


def graph_nodes(outputs, kind):
    """The autograd nodes of class ``kind`` behind ``outputs``."""
    found, seen = [], set()
    stack = [o.grad_fn for o in outputs]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if isinstance(node, kind._backward_cls):
            found.append(node)
        stack.extend(n for n, _ in node.next_functions)
    return found


def blocks(model):
    return [b for layer in model.res_layers for b in getattr(model, layer)]
