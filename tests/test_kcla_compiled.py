"""The C++ kernels of kcla_implementation='compiled' (kcla_mm/csrc,
kcla_mm/models/layers/kcla/compiled.py) against the same arithmetic in
PyTorch ops: plane borders of every size, batch or running statistics, drop
path, branch scale, in place; which calls 'auto' sends to them; and the
fallback where they are not built. Whole layers and backbones against the
reference are in test_kcla_fused.py and test_kcla_recompute.py."""

import copy

import pytest
import torch
import torch.nn.functional as F
from mmdet.models.backbones import ResNet

import kcla_mm.models.layers.kcla.compiled as kcla_compiled
from kcla_mm.analysis.complexity import count_flops
from kcla_mm.models import KCLAResNet
from kcla_mm.models.layers import KCLALayer, KCLAState
from kcla_mm.models.layers.kcla import STATE_EPS
from kcla_mm.models.layers.kcla.fused import fused_query_key, gate_and_weight
from kcla_mm.models.layers.kcla.recompute import torch_pooled
from helpers import (adapter_case, assert_close_to_max, incoming_state,
                     skip_module_without_extension)
from official_reference import randomise_

skip_module_without_extension('which this module tests')


def branch_in_torch(x, u_prev, w, scale, kernel, gamma, beta, mean, var, eps,
                    branch_scale, mask):
    """What branch_forward computes, in PyTorch ops, per (sample, head)
    ``w`` and ``scale``; mean/var None: the batch's statistics."""
    n, c = x.shape[:2]
    per_channel = c // w.shape[1]

    def expand(t):
        return t.repeat_interleave(per_channel, dim=1)[..., None, None]

    u = x * expand(w) if u_prev is None else u_prev + x * expand(w)
    v = F.conv2d(u * expand(scale), kernel, padding=1, groups=c)
    y = F.batch_norm(v, mean, var, gamma, beta, mean is None, 0., eps)
    r = F.relu(y)
    if branch_scale is not None:
        r = r * branch_scale.view(1, -1, 1, 1)
    if mask is not None:
        r = r * mask.view(-1, 1, 1, 1)
    return x + r, u


def random_args(n, c, h, w, heads, dtype, first, batch_stats, masked, scaled):
    g = torch.Generator().manual_seed(n * 1000 + h * 10 + w)

    def rand(*shape, low=-1., high=1.):
        return (torch.rand(*shape, generator=g, dtype=dtype) * (high - low) +
                low)

    x = rand(n, c, h, w, low=0.)
    # A raw state: the sum of a few layers' w X, far from unit scale.
    u_prev = None if first else rand(n, c, h, w, low=0., high=50.)
    weights = rand(n, heads, low=1., high=20.)
    scale = rand(n, heads, low=0.01, high=0.1)
    kernel = rand(c, 1, 3, 3)
    gamma, beta = rand(c, low=0.5, high=1.5), rand(c, low=-0.5, high=0.5)
    mean = None if batch_stats else rand(c)
    var = None if batch_stats else rand(c, low=0.5, high=2.)
    branch_scale = rand(c) if scaled else None
    mask = None
    if masked:
        mask = torch.tensor([0., 2.] * n, dtype=dtype)[:n]
    return (x, u_prev, weights, scale, kernel, gamma, beta, mean, var, 1e-5,
            branch_scale, mask)


def variant_forward(ext, n, size, batch_stats, variant, dtype):
    """random_args of a test variant ('first', 'carry', 'masked',
    'scaled'; 8 channels, 2 heads) and branch_forward's outputs on them."""
    args = random_args(
        n,
        8,
        *size,
        heads=2,
        dtype=dtype,
        first=variant == 'first',
        batch_stats=batch_stats,
        masked=variant == 'masked',
        scaled=variant == 'scaled')
    (x, u_prev, w, scale, kernel, gamma, beta, mean, var, eps, branch_scale,
     mask) = args
    return args, ext.branch_forward(x, u_prev, w, scale, kernel, gamma, beta,
                                    mean, var, batch_stats, eps, branch_scale,
                                    mask, False, False)


SIZES = [(1, 1), (1, 5), (5, 1), (2, 2), (2, 3), (3, 3), (4, 7), (9, 7),
         (5, 19)]


@pytest.mark.parametrize('n,size',
                         [(3, s) for s in SIZES] + [(1, s) for s in SIZES[1:]])
@pytest.mark.parametrize('batch_stats', [True, False])
@pytest.mark.parametrize('variant', ['first', 'carry', 'masked', 'scaled'])
def test_branch_kernels_are_the_torch_ops(ext, size, n, batch_stats, variant):
    """float64 forward (values, state, statistics) and backward (every
    input's gradient) of one layer's block-sized work on planes of every
    border case (1, 2, 3 rows or columns: the flat conv loop and its
    corrections)."""
    args, (out, u, got_mean,
           got_var) = variant_forward(ext, n, size, batch_stats, variant,
                                      torch.float64)
    (x, u_prev, w, scale, kernel, gamma, beta, mean, var, eps, branch_scale,
     mask) = args

    leaves = [
        t for t in (x, u_prev, w, scale, kernel, gamma, beta, branch_scale)
    ]
    leaves = [
        None if t is None else t.clone().requires_grad_() for t in leaves
    ]
    want_out, want_u = branch_in_torch(leaves[0], leaves[1], leaves[2],
                                       leaves[3], leaves[4], leaves[5],
                                       leaves[6], mean, var, eps, leaves[7],
                                       mask)
    assert_close_to_max(out, want_out, 1e-12)
    assert_close_to_max(u, want_u, 1e-12)
    if batch_stats:
        with torch.no_grad():
            v = F.conv2d(
                want_u * scale.repeat_interleave(4, 1)[..., None, None],
                kernel,
                padding=1,
                groups=8)
        assert_close_to_max(got_mean, v.mean((0, 2, 3)), 1e-12)
        assert_close_to_max(got_var, v.var((0, 2, 3), unbiased=False), 1e-12)
    else:
        assert torch.equal(got_mean, mean) and torch.equal(got_var, var)

    grad_out, grad_u = torch.randn_like(out), torch.randn_like(u)
    grads = ext.branch_backward(grad_out, grad_u, x, u_prev, w, scale, kernel,
                                gamma, beta, got_mean, got_var, batch_stats,
                                eps, branch_scale, mask, None, None)
    # Written over the incoming gradients, bit for bit the same.
    over = grad_out.clone(), grad_u.clone()
    written = ext.branch_backward(*over, x, u_prev, w, scale, kernel, gamma,
                                  beta, got_mean, got_var, batch_stats, eps,
                                  branch_scale, mask, *over)
    assert [t.data_ptr() for t in written[:2]] == [t.data_ptr() for t in over]
    assert all(torch.equal(a, b) for a, b in zip(written, grads))
    wanted = [t for t in leaves if t is not None]
    want = torch.autograd.grad((want_out, want_u), wanted, (grad_out, grad_u))
    want = iter(want)
    for got, leaf in zip(grads, leaves):
        if leaf is None:
            continue
        assert_close_to_max(got.view_as(leaf), next(want), 1e-8)


def test_large_planes_keep_fp32_precision(ext):
    """A detection-sized plane (100x150): the plane sums run in fp32
    vectors over blocks, accumulated in double; fp32 kernels against
    float64 ops."""
    args = random_args(
        2,
        4,
        100,
        150,
        heads=1,
        dtype=torch.float64,
        first=False,
        batch_stats=True,
        masked=False,
        scaled=False)
    want_out, want_u = branch_in_torch(*args)
    f32 = [
        None if t is None or isinstance(t, float) else t.float() for t in args
    ]
    f32[9] = args[9]
    out, u, _, _ = ext.branch_forward(*f32[:9], True, *f32[9:], False, False)
    assert_close_to_max(out.double(), want_out, 1e-5)
    assert_close_to_max(u.double(), want_u, 1e-6)


@pytest.mark.parametrize('dtype', [torch.float32, torch.float64])
@pytest.mark.parametrize('size', [(1, 1), (2, 3), (9, 7), (28, 28)])
@pytest.mark.parametrize('batch_stats', [True, False])
@pytest.mark.parametrize('variant', ['first', 'carry', 'masked', 'scaled'])
def test_branch_output_is_the_forward_output(ext, size, batch_stats, variant,
                                             dtype):
    """branch_output from U^t and the statistics branch_forward returned is
    its out bit for bit (what the next block's convs recompute in
    backward, kcla_recompute_outputs), with the batch's statistics or the
    running ones, a dropped sample and a branch scale."""
    args, (out, u, got_mean,
           got_var) = variant_forward(ext, 3, size, batch_stats, variant,
                                      dtype)
    (x, u_prev, w, scale, kernel, gamma, beta, mean, var, eps, branch_scale,
     mask) = args
    again = ext.branch_output(x, u, w, scale, kernel, gamma, beta, got_mean,
                              got_var, eps, branch_scale, mask)
    assert torch.equal(again, out)
    assert again.data_ptr() not in (x.data_ptr(), u.data_ptr())


@pytest.mark.parametrize('out_in_place', [False, True])
@pytest.mark.parametrize('state_in_place', [False, True])
def test_in_place_inference_writes_into_its_inputs(ext, out_in_place,
                                                   state_in_place):
    """The output over x, U^t over U^{t-1}: each where asked, and only
    there."""
    args = random_args(
        2,
        8,
        9,
        7,
        heads=2,
        dtype=torch.float32,
        first=False,
        batch_stats=False,
        masked=False,
        scaled=False)
    x, u_prev = args[0].clone(), args[1].clone()
    want_out, want_u = branch_in_torch(*args)
    out, u, _, _ = ext.branch_forward(x, u_prev, *args[2:9], False, *args[9:],
                                      out_in_place, state_in_place)
    assert (out.data_ptr() == x.data_ptr()) is out_in_place
    assert (u.data_ptr() == u_prev.data_ptr()) is state_in_place
    assert torch.equal(x, args[0]) is not out_in_place
    assert torch.equal(u_prev, args[1]) is not state_in_place
    assert_close_to_max(out, want_out, 1e-5)
    assert_close_to_max(u, want_u, 1e-6)


@pytest.mark.parametrize('carry', [False, True])
def test_pooled_kernel_is_the_torch_ops(ext, float64, carry):
    """Queries, keys, w, gate, Z and gate / (Z + eps) of one layer in
    inference."""
    layer = randomise_(KCLALayer(256, head_dim=32))
    x = torch.rand(3, 256, 9, 7)
    z_prev = torch.rand(3, 8) * 100 if carry else None
    w, z, scale = ext.pooled_forward(x, layer.query_conv.weight,
                                     layer.key_conv.weight, layer.tau,
                                     layer.clamp, layer.head_mix.weight,
                                     z_prev, STATE_EPS, None)
    # The same from precomputed plane means (x not read).
    from_means = ext.pooled_forward(
        torch.empty(3, 256, 9, 7).fill_(float('nan')), layer.query_conv.weight,
        layer.key_conv.weight, layer.tau, layer.clamp, layer.head_mix.weight,
        z_prev, STATE_EPS,
        x.double().mean((2, 3)))
    for ours, theirs in zip(from_means, (w, z, scale)):
        assert_close_to_max(ours, theirs, 1e-12)
    gate, want_w = gate_and_weight(layer.params(),
                                   *fused_query_key(layer.params(), x))
    want_z = want_w if z_prev is None else z_prev + want_w
    assert_close_to_max(w, want_w, 1e-12)
    assert_close_to_max(z, want_z, 1e-12)
    assert_close_to_max(scale, gate / (want_z + STATE_EPS), 1e-12)


@pytest.mark.parametrize('dtype,tolerance', [(torch.float64, 1e-12),
                                             (torch.float32, 2e-5)])
@pytest.mark.parametrize('carry', [False, True])
@pytest.mark.parametrize('grads', ['all', 'scale-only', 'w-and-z'])
def test_pooled_node_is_the_torch_ops_and_their_gradients(
        ext, dtype, tolerance, carry, grads):
    """A train step's pooled vectors (CompiledPooled): the outputs and the
    gradients of the plane means, the ECA convs' weights, Phi and Z^{t-1}
    as autograd gives them through the PyTorch ops, with heads above the
    clamp of ||K|| / tau and outputs without a gradient."""
    layer = randomise_(KCLALayer(256, head_dim=32)).to(dtype)
    x = torch.empty(3, 256, 5, 4, dtype=dtype)
    g = torch.Generator().manual_seed(1)
    means = torch.rand(3, 256, generator=g, dtype=dtype) * 3
    means[0, :64] *= 40  # ||K|| / tau above the clamp in heads 0 and 1
    means.requires_grad_()
    z_prev = (torch.rand(3, 8, generator=g, dtype=dtype) *
              10).requires_grad_() if carry else None
    weights = [torch.randn(3, 8, generator=g, dtype=dtype) for _ in range(3)]
    if grads == 'scale-only':
        weights[:2] = [None, None]
    elif grads == 'w-and-z':
        weights[2] = None
    leaves = [
        means, layer.query_conv.weight, layer.key_conv.weight,
        layer.head_mix.weight
    ] + ([z_prev] if carry else [])
    results = []
    for pooled in (torch_pooled, kcla_compiled.compiled_pooled):
        p = layer.params()
        assert kcla_compiled.pooled_compiles(p, x, z_prev)
        outputs = pooled(p, x, means, z_prev)
        loss = sum((o * wt).sum() for o, wt in zip(outputs, weights)
                   if wt is not None)
        results.append(
            list(outputs) +
            list(torch.autograd.grad(loss, leaves, allow_unused=True)))
    w = results[0][0]
    assert (w[0, :2] == torch.exp(torch.tensor(
        layer.clamp, dtype=dtype))).all(), 'the test should reach the clamp'
    for want, ours in zip(*results):
        if want is None:
            assert ours is None or not ours.abs().max()
            continue
        assert ours.dtype == want.dtype and ours.shape == want.shape
        assert_close_to_max(ours, want, tolerance)


def test_pooled_node_falls_back_where_it_does_not_apply(ext, monkeypatch):
    """A Z^{t-1} in another dtype or not contiguous (a caller's state)
    takes the PyTorch ops."""
    calls = []
    monkeypatch.setattr(kcla_compiled.CompiledPooled, 'apply',
                        lambda *a: calls.append(1))
    layer = randomise_(KCLALayer(256, head_dim=32))
    p, x = layer.params(), torch.rand(2, 256, 5, 4)
    for z_prev in (torch.rand(8, 2).t(), torch.rand(2, 8,
                                                    dtype=torch.float64)):
        assert not kcla_compiled.pooled_compiles(p, x, z_prev)
        ours = kcla_compiled.compiled_pooled(p, x, None, z_prev)
        for a, b in zip(ours, torch_pooled(p, x, None, z_prev)):
            assert torch.equal(a, b)
    assert not calls


def test_train_steps_run_the_pooled_node(ext, monkeypatch):
    """'auto' runs CompiledPooled in a train step of a whole backbone (with
    and without the fused block tail), and nowhere in inference."""
    calls = []
    real = kcla_compiled.CompiledPooled.apply
    monkeypatch.setattr(kcla_compiled.CompiledPooled, 'apply',
                        lambda *a: calls.append(1) or real(*a))
    model = KCLAResNet(depth=18, out_indices=(3, ))
    model(torch.rand(2, 3, 64, 64))[0].sum().backward()
    assert len(calls) == 8  # one per block
    calls.clear()
    with torch.no_grad():
        model(torch.rand(2, 3, 64, 64))
    assert not calls


@pytest.mark.parametrize('n', [1, 3])
@pytest.mark.parametrize(
    'case',
    ['adapt-stride2', 'adapt-stride3', 'adapt-stride1', 'renorm', 'no-affine'])
def test_renormalise_kernel_is_algorithm_1(ext, case, n):
    """Algorithm 1 in inference in one kernel call against the reference's
    ``renormalise``, in float64 and float32: a strided adapter over odd
    sizes whose groups split the incoming heads, a stride-1 adapter (a
    dilated stage), no adapter (the official block 11) and a state norm
    without affine parameters."""
    if case in ('renorm', 'no-affine'):
        layer = randomise_(KCLALayer(256, renorm=True))
        state = incoming_state('carry', n)
        if case == 'no-affine':
            layer.state_norm.weight = layer.state_norm.bias = None
    else:
        layer, state = adapter_case(int(case[-1]), n, u_high=50., z_high=20.)
    layer.eval()
    for dtype, tolerance in ((torch.float64, 1e-12), (torch.float32, 1e-5)):
        layer.to(dtype)
        cast = KCLAState(state.u.to(dtype), state.z.to(dtype))
        with torch.no_grad():
            assert kcla_compiled.renormalise_compiles(layer.params(), cast)
            ours = kcla_compiled.compiled_renormalise(layer.params(), cast)
            want = layer.renormalise(cast)
        assert ours.u.shape == want.u.shape and ours.u.dtype == dtype
        for a, b in zip(ours, want):
            assert_close_to_max(a, b, tolerance)


def test_renormalise_kernel_where_it_applies(ext):
    """Inference only, with a plain adapter of one stride and the ECA key
    conv; everything else runs the PyTorch path."""
    layer = randomise_(
        KCLALayer(256, renorm=True, state_channels=128, state_stride=2))
    state = KCLAState(torch.rand(2, 128, 17, 13), torch.rand(2, 2) + 0.5)
    layer.eval()
    assert not kcla_compiled.renormalise_compiles(layer.params(), state)
    with torch.no_grad():
        assert kcla_compiled.renormalise_compiles(layer.params(), state)
        layer.state_adapt.stride = (2, 1)
        assert not kcla_compiled.renormalise_compiles(layer.params(), state)
        layer.state_adapt.stride = (2, 2)
        layer.state_key_conv.padding = (0, )
        assert not kcla_compiled.renormalise_compiles(layer.params(), state)


class CountingExtension:
    """The kernels, counting the calls that reach them."""

    def __init__(self, ext):
        self.ext, self.calls = ext, 0

    def __getattr__(self, name):
        fn = getattr(self.ext, name)

        def counted(*args):
            self.calls += 1
            return fn(*args)

        return counted


def calls_into_kernels(monkeypatch, ext, run) -> int:
    counting = CountingExtension(ext)
    monkeypatch.setattr(kcla_compiled, 'extension', lambda: counting)
    run()
    return counting.calls


@pytest.mark.parametrize('case', [
    'nchw-train', 'nchw-eval', 'channels_last', 'group_norm', 'autocast',
    'fused'
])
def test_auto_runs_the_kernels_where_they_apply(ext, monkeypatch, case):
    """'auto' (the default) runs the kernels for NCHW fp32 with BN, in train
    steps and inference, and the fused path for what they do not cover;
    the values are the reference's either way."""
    norm_cfg = dict(type='GN', num_groups=4) if case == 'group_norm' else \
        dict(type='BN')
    layer = randomise_(
        KCLALayer(
            256,
            implementation='fused' if case == 'fused' else 'auto',
            drop_path=0.,
            norm_cfg=norm_cfg))
    layer.train(case != 'nchw-eval')
    x = torch.rand(2, 256, 9, 7)
    state = incoming_state('carry', 2)
    if case == 'channels_last':
        x = x.contiguous(memory_format=torch.channels_last)
    results = {}

    def run():
        with torch.autocast('cpu', enabled=case == 'autocast'):
            results['ours'] = layer(x.requires_grad_(), state)

    calls = calls_into_kernels(monkeypatch, ext, run)
    assert (calls > 0) is case.startswith('nchw'), calls
    if case != 'autocast':
        y, new_state = results['ours']
        y_ref, state_ref = layer.forward_reference(x, state)
        assert_close_to_max(y, y_ref, 1e-5)
        assert_close_to_max(new_state.u, state_ref.u, 1e-5)


def test_tracing_records_the_pytorch_ops(ext, monkeypatch):
    """torch.jit.trace (mmengine's FLOP counter, ONNX export) cannot see
    into the kernels: under tracing 'auto' runs the fused path, so a traced
    backbone computes other inputs correctly and its FLOPs are the fused
    path's."""
    model = KCLAResNet(depth=18, base_channels=16, head_dim=16).eval()
    x, other = torch.rand(1, 3, 32, 32), torch.rand(1, 3, 32, 32)
    with torch.no_grad():
        # check_trace=False: the check would run the model again, untraced.
        calls = calls_into_kernels(
            monkeypatch, ext,
            lambda: torch.jit.trace(model, (x, ), check_trace=False))
        traced = torch.jit.trace(model, (x, ))
        want = model(other)
        for got, ref in zip(traced(other), want):
            assert_close_to_max(got, ref, 1e-5)
    assert calls == 0
    fused = KCLAResNet(
        depth=18, base_channels=16, head_dim=16, kcla_implementation='fused')
    fused.load_state_dict(model.state_dict())
    assert count_flops(model, x) == count_flops(fused, x) > count_flops(
        ResNet(depth=18, base_channels=16), x)


def test_a_gradient_buffer_of_another_shape_is_refused(ext):
    (x, u_prev, w, scale, kernel, gamma, beta, mean, var, eps, branch_scale,
     mask), (out, u, got_mean,
             got_var) = variant_forward(ext, 2, (5, 6), True, 'carry',
                                        torch.float32)
    grad = torch.ones_like(out)
    for wrong in (grad[:1], grad.double(), grad.transpose(2, 3)):
        with pytest.raises(RuntimeError, match='grad_u_prev_out must be'):
            ext.branch_backward(grad, grad.clone(), x, u_prev, w, scale,
                                kernel, gamma, beta, got_mean, got_var, True,
                                eps, branch_scale, mask, None, wrong)
    # A buffer may be the gradient it replaces, not the other one.
    other = grad.clone()
    for grads, outs in (((grad, grad), (grad, None)), ((grad, other), (other,
                                                                       None)),
                        ((grad, other), (None, grad)), ((grad, other),
                                                        (grad, grad))):
        with pytest.raises(RuntimeError, match='must not share memory'):
            ext.branch_backward(*grads, x, u_prev, w, scale, kernel, gamma,
                                beta, got_mean, got_var, True, eps,
                                branch_scale, mask, *outs)


def test_a_build_of_older_sources_is_not_loaded(monkeypatch, ext):
    """A module whose kernels take other arguments (a source tree updated
    without reinstalling) is left unloaded, with a warning that says how
    to rebuild it; 'auto' then runs the pure-PyTorch layer."""
    assert ext.interface == kcla_compiled.KERNEL_INTERFACE

    class OlderBuild:
        __file__ = 'old.so'
        interface = kcla_compiled.KERNEL_INTERFACE - 1

    monkeypatch.setattr(kcla_compiled.importlib, 'import_module',
                        lambda name: OlderBuild)
    kcla_compiled.load_extension.cache_clear()
    try:
        with pytest.warns(UserWarning, match='other sources.*reinstall'):
            assert kcla_compiled.extension() is None
    finally:
        monkeypatch.undo()
        kcla_compiled.load_extension.cache_clear()
    assert kcla_compiled.extension() is ext


def test_without_the_extension(monkeypatch):
    """Where setup could not build the kernels: 'auto' computes the same
    with the fused path, and asking for 'compiled' names what is missing
    and how to build it."""
    layer = randomise_(KCLALayer(256, drop_path=0.)).eval()
    x = torch.rand(2, 256, 9, 7)
    with torch.no_grad():
        want, _ = layer(x, None)
    monkeypatch.setattr(kcla_compiled, 'load_extension', lambda: None)
    assert not layer.recomputes_backward(x, None)
    with torch.no_grad():
        got, _ = layer(x, None)
    assert_close_to_max(got, want, 1e-5)
    with pytest.raises(RuntimeError, match='kcla_mm._kcla_cpu_t.*not built'):
        KCLALayer(256, implementation='compiled')
    with pytest.raises(RuntimeError, match='pip install'):
        KCLAResNet(depth=18, head_dim=16, kcla_implementation='compiled')


@pytest.mark.parametrize('value', ['1', 'yes'])
def test_the_environment_turns_the_extension_off(monkeypatch, value):
    """KCLA_MM_NO_EXTENSION (anything but '' or '0') makes the runtime
    behave as an install without the kernels: 'auto' runs 'fused', and
    'compiled' refuses to build, naming the variable."""
    layer = randomise_(KCLALayer(256, drop_path=0.)).eval()
    x = torch.rand(2, 256, 9, 7)
    with torch.no_grad():
        want, _ = layer(x, None)
    assert layer.last_implementation == 'compiled'
    for off in ('', '0'):
        monkeypatch.setenv('KCLA_MM_NO_EXTENSION', off)
        assert kcla_compiled.extension() is not None
    monkeypatch.setenv('KCLA_MM_NO_EXTENSION', value)
    assert kcla_compiled.extension() is None
    assert not layer.recomputes_backward(x, None)
    with torch.no_grad():
        got, _ = layer(x, None)
    assert layer.last_implementation == 'fused'
    assert_close_to_max(got, want, 1e-5)
    with pytest.raises(RuntimeError, match='KCLA_MM_NO_EXTENSION'):
        KCLALayer(256, implementation='compiled')


def test_one_value_per_channel_is_refused_as_by_batch_norm():
    """A training BN cannot normalise one value per channel; the layer
    says so as PyTorch's BN does instead of dividing by sqrt(eps)."""
    layer = KCLALayer(64, head_dim=32).train()
    with pytest.raises(ValueError, match='more than 1 value per channel'):
        layer(torch.rand(1, 64, 1, 1, requires_grad=True), None)
    with torch.no_grad(), pytest.raises(ValueError, match='more than 1'):
        layer(torch.rand(1, 64, 1, 1), None)


@pytest.mark.parametrize('momentum', [0.1, None])
def test_running_statistics_are_updated_once(float64, momentum):
    """A training BN in the kernels updates its running statistics as
    PyTorch's BN does (exponential or, with momentum None, cumulative
    average), in train steps and in no-grad forwards."""
    norm_cfg = dict(type='BN', momentum=momentum)
    ref = randomise_(KCLALayer(256, drop_path=0., norm_cfg=norm_cfg))
    ref.implementation = 'reference'
    ours = KCLALayer(256, drop_path=0., norm_cfg=norm_cfg)
    ours.load_state_dict(ref.state_dict())
    ours.implementation = 'compiled'
    ref.train(), ours.train()
    x = torch.rand(3, 256, 9, 7)
    state = incoming_state('carry', 3)
    for grad in (True, False, True):
        with torch.set_grad_enabled(grad):
            ours(x.clone().requires_grad_(grad), state)
            ref(x.clone().requires_grad_(grad), state)
    for name in ('running_mean', 'running_var', 'num_batches_tracked'):
        assert_close_to_max(
            getattr(ours.norm, name).double(),
            getattr(ref.norm, name).double(), 1e-12)
    assert int(ours.norm.num_batches_tracked) == 3


def test_an_earlier_graph_of_the_layer_survives_its_statistics_update():
    """A layer that ran PyTorch's BN ('fused', as 'auto' does for a
    channels_last input) and then the kernels in the same train step: the
    kernels' update of the running statistics leaves the first graph
    differentiable, as a second PyTorch BN would, and both backward passes
    give the gradients of two 'fused' calls."""
    layer = randomise_(KCLALayer(256, drop_path=0.)).double().train()
    ref = copy.deepcopy(layer)
    x = torch.rand(3, 256, 9, 7, dtype=torch.float64)
    state = KCLAState(*(t.double() for t in incoming_state('carry', 3)))
    grads = []
    for model, second in ((layer, 'compiled'), (ref, 'fused')):
        inputs = [x.clone().requires_grad_(), x.clone().requires_grad_()]
        model.implementation = 'fused'
        first_out = model(inputs[0], state)[0]
        model.implementation = second
        second_out = model(inputs[1], state)[0]
        assert model.last_implementation == second
        grads.append(
            torch.autograd.grad(
                first_out.square().sum() + second_out.square().sum(),
                inputs + list(model.parameters())))
    for a, b in zip(*grads):
        assert_close_to_max(a, b, 1e-10)
    for name in ('running_mean', 'running_var'):
        assert_close_to_max(
            getattr(layer.norm, name), getattr(ref.norm, name), 1e-12)
