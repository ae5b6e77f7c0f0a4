"""The compiled layer's backward writes its gradients over the ones it
received only where nothing else holds them
(kcla_mm/models/layers/kcla/gradient_reuse.py): a gradient shared with
another node, kept by a hook or a leaf, or a view of a larger one is left
as it is, and every gradient is the one computed without any reuse."""

import sys

import pytest
import torch

import kcla_mm.models.layers.kcla.compiled as kcla_compiled
from kcla_mm.models import KCLAResNet
from kcla_mm.models.layers import KCLALayer
from kcla_mm.models.layers.kcla import gradient_reuse
from helpers import skip_module_without_extension
from official_reference import randomise_

skip_module_without_extension('whose backward this module tests')


@pytest.fixture(autouse=True)
def untraced():
    """Each test without the trace and profile functions of the run
    (coverage's, a debugger's), under which nothing is reused; restored
    after it."""
    trace, profile = sys.gettrace(), sys.getprofile()
    sys.settrace(None)
    sys.setprofile(None)
    yield
    sys.settrace(trace)
    sys.setprofile(profile)


@pytest.fixture
def written_over(monkeypatch):
    """(grad_x written over grad_out, grad_u_prev over grad_u) for each
    call of the kernels' backward, as the layer called it."""
    ext = kcla_compiled.extension()
    calls = []
    backward = ext.branch_backward

    def recording(*args):
        calls.append((args[-2] is not None, args[-1] is not None))
        return backward(*args)

    monkeypatch.setattr(ext, 'branch_backward', recording)
    return calls


def test_the_probe_tells_unshared_gradients_from_shared_ones():
    assert gradient_reuse.unshared_holders() is not None


def layer_and_input():
    torch.manual_seed(0)
    layer = randomise_(
        KCLALayer(16, head_dim=8, drop_path=0.,
                  implementation='compiled')).double()
    x = torch.rand(2, 16, 5, 6, dtype=torch.float64, requires_grad=True)
    return layer, x


def weights(like, seed):
    return torch.randn(
        like.shape,
        dtype=like.dtype,
        generator=torch.Generator().manual_seed(seed))


def plain(out, u, extra):
    return (out * weights(out, 1)).sum() + (u * weights(u, 2)).sum()


def shared_with_a_later_node(out, u, extra):
    # AddBackward hands out's gradient to y's MulBackward too, which runs
    # after the layer's node (made before it).
    return ((out + extra['y']) * weights(out, 1)).sum() + (u * 3.).sum()


def shared_by_both_outputs(out, u, extra):
    return ((out + u) * weights(out, 1)).sum()


def kept_by_a_hook(out, u, extra):
    out.register_hook(extra['kept'].append)
    return plain(out, u, extra)


def storage_kept_by_a_hook(out, u, extra):
    out.register_hook(
        lambda grad: extra['storages'].append(grad.untyped_storage()))
    return plain(out, u, extra)


def numpy_owned(out, u, extra):
    # The hook's gradient is in memory that numpy owns and keeps.
    def to_numpy(grad):
        extra['array'] = grad.numpy().copy()
        return torch.from_numpy(extra['array'])

    out.register_hook(to_numpy)
    return plain(out, u, extra)


def shared_with_a_leaf(out, u, extra):
    # The leaf's AccumulateGrad runs first and copies the gradient (it
    # cannot take it while the layer's input buffer holds it too): the
    # layer may then write over it.
    return ((out + extra['leaf']) * weights(out, 1)).sum() + (u * 3.).sum()


def a_view_of_a_larger_gradient(out, u, extra):
    both = torch.cat([out, u], 1)
    return (both * weights(both, 1)).sum()


CASES = {
    plain: (True, True),
    shared_with_a_later_node: (False, True),
    shared_by_both_outputs: (False, False),
    kept_by_a_hook: (False, True),
    storage_kept_by_a_hook: (False, True),
    numpy_owned: (False, True),
    shared_with_a_leaf: (True, True),
    a_view_of_a_larger_gradient: (False, False),
}


def step(use):
    """The gradients of x, the layer's parameters, and what the loss
    shares out's gradient with (y's input, a kept gradient, a leaf)."""
    layer, x = layer_and_input()
    source = torch.rand_like(x, requires_grad=True)
    extra = {
        'y': source * 1.,
        'kept': [],
        'storages': [],
        'leaf': torch.zeros_like(x)
    }
    extra['leaf'].requires_grad_()
    out, state = layer(x, None)
    use(out, state.u, extra).backward()
    shared = [source.grad, extra['leaf'].grad] + extra['kept']
    shared += [
        torch.empty(0, dtype=x.dtype).set_(storage)
        for storage in extra['storages']
    ]
    if 'array' in extra:
        shared.append(torch.from_numpy(extra['array']))
    return ([x.grad] + [p.grad for p in layer.parameters()],
            [t for t in shared if t is not None])


@pytest.mark.parametrize('use', list(CASES), ids=lambda f: f.__name__)
def test_a_gradient_is_written_over_only_where_nothing_else_holds_it(
        use, written_over, monkeypatch):
    grads, shared = step(use)
    assert written_over == [CASES[use]]
    monkeypatch.setattr(kcla_compiled, 'reusable_gradients', lambda *grads:
                        (False, ) * len(grads))
    want_grads, want_shared = step(use)
    assert written_over[1:] == [(False, False)]
    assert len(grads) == len(want_grads) and len(shared) == len(want_shared)
    for got, want in zip(grads + shared, want_grads + want_shared):
        assert torch.equal(got, want)


def test_nothing_is_reused_under_a_trace_function(written_over):
    """A tracer that reads the frames' locals holds references of its own
    (a debugger, a call logger): nothing is reused while one is set, and
    the calibration is not made under one."""
    gradient_reuse._calibrated.cache_clear()
    frames = []

    def tracer(frame, event, arg):
        frames.append(frame.f_locals)
        return tracer

    sys.settrace(tracer)
    try:
        assert gradient_reuse.unshared_holders() is None
        step(plain)
    finally:
        sys.settrace(None)
    assert written_over == [(False, False)]
    assert gradient_reuse._calibrated.cache_info().currsize == 0
    step(plain)
    assert written_over[1:] == [(True, True)]


def test_a_backbone_train_step_writes_over_its_gradients(written_over):
    """Within the backbone each layer's gradients reach it from the next
    layer's node and the next block alone; torch 2.1 hands the last
    layer's unused state a zero gradient that the probe cannot count as
    unshared."""
    torch.manual_seed(0)
    model = KCLAResNet(depth=50, kcla_drop_path=0.)
    x = torch.rand(2, 3, 64, 64, requires_grad=True)
    sum(o.square().mean() for o in model(x)).backward()
    assert len(written_over) == 16
    assert all(out for out, _ in written_over)
    assert all(u for _, u in written_over[1:])
