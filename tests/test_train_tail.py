"""The fused end of a residual block in a train step
(kcla_mm/models/layers/kcla/train_tail.py): its kernels against PyTorch's
add, ReLU, plane mean and their backward, bit for bit (special values
included) and at any thread count; the backbone with it against the same
backbone whose block tails run as modules (a forward hook on each block's
ReLU turns it off, as it does for a user); and the cases where it stands
aside."""
import copy

import pytest
import torch
import torch.nn as nn

from kcla_mm.models import KCLAResNet
from kcla_mm.models.layers import KCLALayer
from kcla_mm.models.layers.kcla.compiled import extension
from kcla_mm.models.layers.kcla.train_tail import AddReLUMeans
from helpers import assert_close_to_max, blocks, graph_nodes
from official_reference import randomise_

pytestmark = pytest.mark.skipif(
    extension() is None,
    reason='the compiled kernels are not built or KCLA_MM_NO_EXTENSION is '
    'set: every block tail then runs as modules')

DTYPES = [torch.float32, torch.float64]
SETTINGS = {
    'bn': dict(norm_eval=False),
    'detection': dict(frozen_stages=1, norm_eval=True),
}


def special_case(dtype):
    """(pre, identity, grad_x, grad_means) of odd sizes, with zeros, a NaN
    result and an infinite gradient where the ReLU is off."""
    torch.manual_seed(0)
    pre = torch.randn(3, 5, 7, 9, dtype=dtype)
    identity = torch.randn(3, 5, 7, 9, dtype=dtype)
    identity[0, 0, 0, :3] = -pre[0, 0, 0, :3]  # sums of exactly zero
    pre[1, 2, 3, 4] = float('nan')
    grad_x = torch.randn(3, 5, 7, 9, dtype=dtype)
    grad_means = torch.randn(3, 5, dtype=dtype)
    return pre, identity, grad_x, grad_means


def expected(pre, identity, grad_x, grad_means):
    """What eager PyTorch computes: the block's in-place add and ReLU, the
    layer's spatial mean, and autograd's backward through them."""
    x = torch.relu(pre + identity)
    hw = x.shape[2] * x.shape[3]
    grad = torch.ops.aten.threshold_backward(
        grad_x + (grad_means / hw)[..., None, None], x, 0)
    return x, x.sum((2, 3)) / hw, grad


@pytest.mark.parametrize('dtype', DTYPES)
def test_kernels_are_pytorch_ops(dtype):
    pre, identity, grad_x, grad_means = special_case(dtype)
    want_x, want_means, want_grad = expected(pre, identity, grad_x, grad_means)
    x = pre.clone()
    got_x, means = extension().add_relu_means(x, identity)
    assert got_x.data_ptr() == x.data_ptr()  # written over pre
    torch.testing.assert_close(got_x, want_x, rtol=0, atol=0, equal_nan=True)
    finite = ~want_means.isnan()
    assert finite.sum() == want_means.numel() - 1  # the NaN's plane
    assert means[~finite].isnan().all()
    torch.testing.assert_close(
        means[finite],
        want_means[finite],
        rtol=1e-6 if dtype == torch.float32 else 1e-14,
        atol=0)
    # An infinite gradient where x <= 0 gives 0, as threshold_backward.
    off = (got_x <= 0).nonzero()[0].tolist()
    grad_x[tuple(off)] = float('inf')
    want_grad = expected(pre, identity, grad_x, grad_means)[2]
    assert want_grad[tuple(off)] == 0
    for out in (None, torch.empty_like(grad_x), grad_x.clone()):
        got = extension().add_relu_means_backward(
            grad_x if out is None else out.copy_(grad_x), grad_means, got_x,
            out)
        if out is not None:
            assert got.data_ptr() == out.data_ptr()
        torch.testing.assert_close(
            got, want_grad, rtol=0, atol=0, equal_nan=True)


def test_kernels_do_not_depend_on_threads():
    pre, identity, grad_x, grad_means = special_case(torch.float32)
    pre, identity = pre.repeat(2, 40, 9, 9), identity.repeat(2, 40, 9, 9)
    grad_x, grad_means = grad_x.repeat(2, 40, 9, 9), grad_means.repeat(2, 40)
    runs = []
    for n in (1, 2, 3):  # conftest.py puts the thread count back
        torch.set_num_threads(n)
        x, means = extension().add_relu_means(pre.clone(), identity)
        grad = extension().add_relu_means_backward(grad_x, grad_means, x, None)
        runs.append((x, means, grad))
    for run in runs[1:]:
        for a, b in zip(run, runs[0]):
            torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)


def relus_hooked(model):
    """``model`` with a no-op forward hook on every block's ReLU: the
    block tails then run as modules."""
    for block in blocks(model):
        block.relu.register_forward_hook(lambda module, args, out: None)
    return model


def train_step(model, x, grads):
    model.train()
    model.zero_grad(set_to_none=True)
    x.grad = None
    torch.manual_seed(3)  # the same drop-path masks for both
    outs = model(x)
    nodes = graph_nodes(outs, AddReLUMeans)
    torch.autograd.backward(outs, grads)
    params = [x] + [p for p in model.parameters() if p.requires_grad]
    return outs, [p.grad for p in params], nodes


@pytest.mark.parametrize('recompute_outputs', [True, False])
@pytest.mark.parametrize('setting', ['bn', 'detection'])
@pytest.mark.parametrize('depth', [18, 50, 101])
def test_backbone_with_fused_tails_is_the_modules(depth, setting,
                                                  recompute_outputs):
    """fp64, odd sizes, drop path: outputs, every gradient and the BN
    statistics within 1e-12 of the largest (the plane means are summed in
    another order), every block's tail fused, with the block's output
    kept or recomputed."""
    common = dict(
        depth=depth,
        base_channels=8,
        head_dim=8,
        kcla_drop_path=0.3,
        kcla_recompute_outputs=recompute_outputs,
        **SETTINGS[setting])
    fused = randomise_(KCLAResNet(**common)).double()
    modules = relus_hooked(copy.deepcopy(fused))
    x = torch.randn(2, 3, 45, 39, dtype=torch.float64, requires_grad=True)
    with torch.no_grad():
        grads = [torch.randn_like(o) for o in copy.deepcopy(fused).train()(x)]
    out_f, grad_f, nodes = train_step(fused, x, grads)
    out_m, grad_m, none = train_step(modules, x, grads)
    assert len(nodes) == len(blocks(fused)) and not none
    assert {
        m.last_implementation
        for m in fused.modules() if isinstance(m, KCLALayer)
    } == {'compiled'}
    for a, b in zip(list(out_f) + grad_f, list(out_m) + grad_m):
        assert_close_to_max(a, b, 1e-12)
    for a, b in zip(fused.buffers(), modules.buffers()):
        assert_close_to_max(a.double(), b.double(), 1e-12)


def layer_hooked(model):
    for m in model.modules():
        if isinstance(m, KCLALayer):
            m.register_forward_hook(lambda module, args, out: None)
    return model


STAND_ASIDE = {
    # hooks on what the fused tail would not call as a module
    'relu hook': (dict(), relus_hooked),
    'layer hook': (dict(), layer_hooked),
    'with_cp': (dict(with_cp=True), None),
    'fused layers': (dict(kcla_implementation='fused'), None),
    'channels_last':
    (dict(), lambda m: m.to(memory_format=torch.channels_last)),
}


@pytest.mark.parametrize('case', sorted(STAND_ASIDE))
def test_stands_aside(case):
    kwargs, change = STAND_ASIDE[case]
    model = randomise_(
        KCLAResNet(depth=18, base_channels=8, head_dim=8, **kwargs))
    if change is not None:
        model = change(model)
    x = torch.randn(2, 3, 33, 31, requires_grad=True)
    if case == 'channels_last':
        x = x.detach().to(memory_format=torch.channels_last).requires_grad_()
    outs = model.train()(x)
    assert not graph_nodes(outs, AddReLUMeans)
    sum(o.sum() for o in outs).backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())


def test_plain_relu_subclass_stands_aside():
    """Only a plain nn.ReLU: a subclass may compute something else."""

    class LeakyReLU(nn.ReLU):

        def forward(self, x):
            return torch.nn.functional.leaky_relu(x, 0.1, inplace=True)

    model = randomise_(KCLAResNet(depth=18, base_channels=8, head_dim=8))
    for block in blocks(model):
        block.relu = LeakyReLU(inplace=True)
    outs = model.train()(torch.randn(2, 3, 33, 31, requires_grad=True))
    assert not graph_nodes(outs, AddReLUMeans)
