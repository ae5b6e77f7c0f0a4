"""The GPU lane (issue 27, point 5): KCLA on CUDA. ``make test-gpu`` runs
these tests (``pytest tests -m cuda``); ``make test`` collects them too,
and without CUDA every one skips with the reason 'CUDA is not available'.

* the layer's fast paths ('fused', 'recompute') against its reference on
  the device, in fp64 and fp32: outputs, state and every gradient of a
  train step, for each kind of layer (Algorithm 1 with a strided conv
  included) and for a chain of layers; the device's reference against the
  CPU's;
* KCLAResNet-18 and -50 ('auto') on the device against the CPU reference
  in fp64: outputs, every gradient and the BN statistics of a train step;
* fp16 and bf16 autocast train steps of a KCLA-R50 at a detection size:
  finite loss and gradients, the state in fp32, the outputs within the
  tolerance of tests/test_half_precision.py of the fp32 run, every
  gradient that is not zero in fp32 pointing its way (none lost to
  underflow);
* SyncBN through mmengine's conversion and its DDP wrapper in a process
  group of one: the KCLA norms become SyncBatchNorm, and a train step
  equals BN's. In a group of one SyncBatchNorm normalises as BN does (it
  exchanges statistics only where the world is larger), so this checks
  the conversion, the wrapper and the dispatch around it, not the
  exchange;
* ``with_cp=True`` keeps no more CUDA memory in a train step than without
  (BN and GN), with the same gradients;
* ``'compiled'`` asked for on CUDA fails naming the condition, and
  ``'auto'`` runs ``'fused'`` there.

mmdet's default ``zero_init_residual=True`` zero-initialises each
block's last norm, so a fresh model's residual branches give nothing and
their convs get no gradient. The ``with_cp`` test turns it off, so that
its gradients cover every block. The autocast test keeps it: a randomly
initialised R50 with live branches drifts far from its fp32 run under
autocast whatever the layer (on the CPU at 96x96, mmdet's plain ResNet-50
by 15% (fp16) and 58% (bf16) of its largest output), so it compares the
parameters that get a gradient (the stem, downsample convs, the blocks'
last norms, KCLA), as users training from scratch start.

fp32 comparisons run with TF32 off (the default for cuDNN convolutions on
Ampere and newer), so that they compare implementations, not TF32's
rounding. Every expected value is computed by the model it is compared
with (on the CPU, or in another precision or configuration).

Dry run on the CPU: ``KCLA_MM_TEST_DEVICE=cpu pytest tests/test_cuda.py``
runs the same test bodies on the CPU (smaller images for the R50 steps),
to check the lane's logic on a machine without a GPU. What only CUDA has
then skips naming itself: peak CUDA memory, SyncBN's train forward (GPU
only in torch), the CUDA dispatch of 'compiled', and fp16 autocast where
the CPU has none (torch 2.1). The variable is read by this module only.
"""
import copy
import math
import os
import re
import warnings

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from mmengine.model import MMDistributedDataParallel, convert_sync_batchnorm

from kcla_mm.models import KCLAResNet
from kcla_mm.models.layers import KCLALayer, KCLAState
from kcla_mm.models.layers.kcla.compiled import extension
from kcla_mm.torch_compat import is_autocast_enabled
from helpers import (assert_close_to_max, assert_finite_and_close,
                     assert_same_values_and_gradients, free_port, gradients,
                     make_case, pair, squares, train_step)
from official_reference import randomise_

#: Set to 'cpu' to dry-run the lane on the CPU (see the module docstring).
DEVICE_ENV = 'KCLA_MM_TEST_DEVICE'
DEVICE = os.environ.get(DEVICE_ENV, 'cuda')
if DEVICE not in ('cuda', 'cpu'):
    raise ValueError(f"{DEVICE_ENV}={DEVICE!r} must be 'cuda' (the default) "
                     "or 'cpu' (a dry run of the GPU lane's logic)")
ON_CUDA = DEVICE == 'cuda'

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(
        ON_CUDA and not torch.cuda.is_available(),
        reason='CUDA is not available'),
]

CASES = ['first', 'carry', 'adapt', 'renorm']
# fp32 against the reference (TF32 off): outputs and state, gradients
# (the CPU dry run measured up to 2.4e-4 on a chain's conv1d weights);
# relative to the largest entry. fp64: helpers' defaults (1e-12, 1e-8).
FP32_TOL, FP32_GRAD_TOL = 1e-5, 1e-3
# The least cosine between a parameter's gradient under autocast and in
# fp32: the CPU dry run measured 0.914 (fp16) and 0.915 (bf16) at least,
# for norm biases and a state key conv, whose gradients are sums that
# cancel.
HALF_GRAD_COSINE = 0.8
# The detection-like size of the R50 steps; smaller in a CPU dry run.
R50_SIZE = 512 if ON_CUDA else 96


def cuda_only(what: str) -> None:
    """Skips the rest of a test in a CPU dry run, saying what it leaves."""
    if not ON_CUDA:
        pytest.skip(f'{DEVICE_ENV}=cpu dry run: {what} needs CUDA')


@pytest.fixture(autouse=True)
def _no_tf32():
    """fp32 convolutions and matmuls in fp32, not TF32, on the device."""
    saved = (torch.backends.cudnn.allow_tf32,
             torch.backends.cuda.matmul.allow_tf32)
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    (torch.backends.cudnn.allow_tf32,
     torch.backends.cuda.matmul.allow_tf32) = saved


@pytest.fixture(params=['float64', 'float32'])
def dtype(request):
    """Each test in fp64 (the default dtype, as the CPU parity tests) and
    fp32; the fp32 run compares within FP32_TOL."""
    if request.param == 'float64':
        request.getfixturevalue('float64')
        return torch.float64
    return torch.float32


def tolerances(dtype: torch.dtype) -> dict:
    return dict(tol=1e-12, grad_tol=1e-8) if dtype == torch.float64 \
        else dict(tol=FP32_TOL, grad_tol=FP32_GRAD_TOL)


def to_device(state):
    return None if state is None else KCLAState(
        state.u.to(DEVICE).requires_grad_(),
        state.z.to(DEVICE).requires_grad_())


@pytest.mark.parametrize('case', CASES)
@pytest.mark.parametrize('implementation', ['fused', 'recompute'])
def test_layer_train_step_is_the_reference(dtype, implementation, case):
    """One layer: 'adapt' is a renorm layer with state_channels and
    state_stride (Algorithm 1 with a strided grouped conv)."""
    layer, x, state = make_case(case)
    layer.to(DEVICE).train()
    layer.implementation = implementation
    x = x.to(DEVICE).requires_grad_()
    state = to_device(state)
    inputs = [x] + ([] if state is None else [state.u, state.z])
    y, new_state = layer(x, state)
    assert layer.last_implementation == implementation
    assert y.device.type == new_state.u.device.type == DEVICE
    y_ref, state_ref = layer.forward_reference(x, state)
    assert_same_values_and_gradients((y, *new_state), (y_ref, *state_ref),
                                     inputs, layer, **tolerances(dtype))


def test_device_reference_is_the_cpu_reference(float64):
    """The reference itself on the device against the CPU's, so that the
    comparisons above are not of two equal device errors."""
    layer, x, state = make_case('adapt')
    layer.train()
    on_device = copy.deepcopy(layer).to(DEVICE)
    runs = []
    for module, device in ((layer, 'cpu'), (on_device, DEVICE)):
        xd = x.to(device).requires_grad_()
        sd = KCLAState(
            state.u.to(device).requires_grad_(),
            state.z.to(device).requires_grad_())
        y, new_state = module.forward_reference(xd, sd)
        outs = (y, *new_state)
        torch.manual_seed(1)
        grad_outputs = [torch.randn(o.shape).to(device) for o in outs]
        params = [xd, sd.u, sd.z] + list(module.parameters())
        runs.append([t.cpu() for t in outs] +
                    [g.cpu() for g in gradients(outs, params, grad_outputs)])
    for a, b in zip(runs[1], runs[0]):
        assert_close_to_max(a, b, 1e-10)


def make_chain():
    """Four layers as two stages see them: a first layer, one carrying the
    state, a renorm layer carrying it to twice the width at half the size
    (after a strided 1x1 conv in place of a block), and one more."""
    layers = nn.ModuleList([
        KCLALayer(128, drop_path=0.),
        KCLALayer(128, drop_path=0.),
        KCLALayer(
            256, renorm=True, state_channels=128, state_stride=2,
            drop_path=0.),
        KCLALayer(256, drop_path=0.),
    ])
    randomise_(layers)
    weight = torch.randn(256, 128, 1, 1) / math.sqrt(128)
    return layers, torch.rand(3, 128, 17, 13), weight


def run_chain(layers, x, weight, reference: bool):
    y, state = x, None
    for i, layer in enumerate(layers):
        if i == 2:
            y = F.conv2d(y, weight, stride=2)
        if reference:
            y, state = layer.forward_reference(y, state)
        else:
            y, state = layer(y, state)
    return y, state.u, state.z


@pytest.mark.parametrize('implementation', ['fused', 'recompute'])
def test_chain_of_layers_is_the_reference(dtype, implementation):
    """'recompute' replays each layer's state from the previous layer's
    tape: a chain checks that across layers and across Algorithm 1."""
    layers, x, weight = make_chain()
    layers.to(DEVICE).train()
    x = x.to(DEVICE).requires_grad_()
    weight = weight.to(DEVICE).requires_grad_()
    for layer in layers:
        layer.implementation = implementation
    ours = run_chain(layers, x, weight, reference=False)
    assert [layer.last_implementation for layer in layers] == \
        [implementation] * len(layers)
    refs = run_chain(layers, x, weight, reference=True)
    assert_same_values_and_gradients(ours, refs, (x, weight), layers,
                                     **tolerances(dtype))


@pytest.mark.parametrize('depth', [18, 50])
def test_backbone_train_step_is_the_cpu_reference(float64, depth):
    """KCLAResNet ('auto': 'fused' on CUDA) on the device against the
    reference on the CPU: outputs, the gradients of the input and every
    parameter, and the BN running statistics after the step. No drop path:
    CUDA and the CPU draw different masks from one seed."""
    reference, ours = pair(
        depth, drop_path=0., implementation='auto', norm_eval=False)
    ours.to(DEVICE)
    x = torch.rand(2, 3, 37, 29)
    with torch.no_grad():
        grad_outputs = [torch.randn_like(o) for o in reference(x)]
    reference.load_state_dict(ours.state_dict())  # undo that forward's stats
    want, want_grads = train_step(reference,
                                  x.clone().requires_grad_(), grad_outputs)
    got, got_grads = train_step(ours,
                                x.to(DEVICE).requires_grad_(),
                                [g.to(DEVICE) for g in grad_outputs])
    ran = {
        m.last_implementation
        for m in ours.modules() if isinstance(m, KCLALayer)
    }
    assert ran == ({'fused'} if ON_CUDA else {'compiled'})
    for a, b in zip(got, want):
        assert a.device.type == DEVICE
        assert_close_to_max(a.cpu(), b, 1e-10)
    assert len(got_grads) == len(want_grads)
    for a, b in zip(got_grads, want_grads):
        assert_close_to_max(a.cpu(), b, 1e-8)
    want_buffers = dict(reference.named_buffers())
    for name, buffer in ours.named_buffers():
        torch.testing.assert_close(
            buffer.cpu(), want_buffers[name], rtol=0, atol=1e-10, msg=name)


def autocast_skip_reason(dtype: torch.dtype):
    """Why ``DEVICE`` cannot autocast to ``dtype``, found by trying (torch
    2.1 has no fp16 CPU autocast; bf16 needs an Ampere or newer GPU)."""
    # torch 2.13's is_bf16_supported() also counts emulated bf16 (Volta,
    # Turing), on which autocast to bf16 is not what users run.
    if ON_CUDA and dtype == torch.bfloat16 and \
            torch.cuda.get_device_capability()[0] < 8:
        return 'this GPU has no bf16 (compute capability below 8.0)'
    try:
        with warnings.catch_warnings():
            warnings.simplefilter('ignore')  # 'Disabling autocast'
            with torch.autocast(DEVICE, dtype=dtype):
                if is_autocast_enabled(DEVICE):
                    return None
    except RuntimeError as exc:
        return f'torch {torch.__version__} has no {dtype} {DEVICE} ' \
            f'autocast ({exc})'
    return f'torch {torch.__version__} turns {dtype} {DEVICE} autocast off'


@pytest.mark.parametrize(
    'dtype', [torch.float16, torch.bfloat16], ids=['fp16', 'bf16'])
def test_amp_train_step_of_r50(dtype):
    """A KCLA-R50 (default widths, 'auto') train step under autocast, as
    mmengine's AmpOptimWrapper runs one, at 2x3x512x512, against the same
    step in fp32."""
    reason = autocast_skip_reason(dtype)
    if reason:
        pytest.skip(reason)
    model = KCLAResNet(depth=50, kcla_drop_path=0., norm_eval=False)
    model.init_weights()
    model.to(DEVICE).train()
    x = torch.randn(2, 3, R50_SIZE, R50_SIZE, device=DEVICE)
    expected = model(x)
    squares(expected).backward()
    expected = [o.detach() for o in expected]
    expected_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    states = []
    hooks = [
        m.register_forward_hook(lambda m, args, out: states.append(out[1]))
        for m in model.modules() if isinstance(m, KCLALayer)
    ]
    with torch.autocast(DEVICE, dtype=dtype):
        outputs = model(x)
        loss = squares(outputs)
    for hook in hooks:
        hook.remove()
    assert len(states) == len(hooks) == 16
    assert all(s.u.dtype == s.z.dtype == torch.float32 for s in states)
    assert all(o.dtype == dtype for o in outputs)
    assert_finite_and_close(outputs, expected, dtype)
    assert torch.isfinite(loss)
    loss.backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None for g in grads)
    assert all(torch.isfinite(g).all() for g in grads), 'non-finite gradient'
    # Without loss scaling (AmpOptimWrapper's GradScaler) small fp16
    # gradients could underflow to zero and still be finite.
    names = [name for name, _ in model.named_parameters()]
    compared = 0
    for name, got, want in zip(names, grads, expected_grads):
        if not want.any():  # a residual branch of the fresh model
            continue
        cosine = F.cosine_similarity(
            got.double().flatten(), want.double().flatten(), dim=0)
        assert cosine > HALF_GRAD_COSINE, (name, cosine.item())
        compared += 1
    assert compared > len(names) // 2, (compared, len(names))


@pytest.fixture
def process_group():
    """A process group of one, as a single-GPU distributed launch makes."""
    dist.init_process_group(
        'nccl' if ON_CUDA else 'gloo',
        init_method=f'tcp://127.0.0.1:{free_port()}',
        rank=0,
        world_size=1)
    yield
    dist.destroy_process_group()


def test_syncbn_train_step_is_bn(float64, process_group):
    """mmengine's conversion (``sync_bn='torch'`` in a config) turns every
    BN, the KCLA layers' included, into SyncBatchNorm; wrapped in
    mmengine's DDP, a train step in a group of one equals BN's."""
    _, bn_model = pair(
        18, drop_path=0., implementation='auto', norm_eval=False)
    sync = convert_sync_batchnorm(copy.deepcopy(bn_model))
    kcla_norms = [
        norm for m in sync.modules() if isinstance(m, KCLALayer)
        for norm in (m.norm, getattr(m, 'state_norm', None))
        if norm is not None
    ]
    assert len(kcla_norms) == 8 + 3  # every layer's, three state norms
    assert all(isinstance(n, nn.SyncBatchNorm) for n in kcla_norms)
    assert not any(isinstance(m, nn.BatchNorm2d) for m in sync.modules())
    cuda_only("SyncBatchNorm's train forward")
    bn_model.to(DEVICE)
    sync = MMDistributedDataParallel(sync.to(DEVICE), device_ids=[0])
    x = torch.rand(2, 3, 37, 29, device=DEVICE)
    with torch.no_grad():
        grad_outputs = [torch.randn_like(o) for o in bn_model.eval()(x)]
    want, want_grads = train_step(bn_model,
                                  x.clone().requires_grad_(), grad_outputs)
    got, got_grads = train_step(sync, x.clone().requires_grad_(), grad_outputs)
    assert {
        m.last_implementation
        for m in sync.modules() if isinstance(m, KCLALayer)
    } == {'fused'}
    for a, b in zip(got, want):
        assert_close_to_max(a, b, 1e-12)
    assert len(got_grads) == len(want_grads)
    for a, b in zip(got_grads, want_grads):
        assert_close_to_max(a, b, 1e-8)
    want_buffers = dict(bn_model.named_buffers())
    for name, buffer in sync.module.named_buffers():
        torch.testing.assert_close(
            buffer, want_buffers[name], rtol=0, atol=1e-12, msg=name)


def peak_train_step(model, x, grad_outputs):
    """A train step's outputs and gradients, and the peak CUDA memory it
    allocated beyond what was allocated before it (None on the CPU)."""
    if ON_CUDA:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    outs, grads = train_step(model, x, grad_outputs)
    if not ON_CUDA:
        return outs, grads, None
    torch.cuda.synchronize()
    return outs, grads, torch.cuda.max_memory_allocated() - before


@pytest.mark.parametrize('norm', ['BN', 'GN'])
def test_with_cp_keeps_no_more_memory(norm):
    """KCLA-R50 ('auto', default widths) with ``with_cp=True`` against the
    same weights without: the same gradients, and a peak no higher (the
    norm_cfg reaches the KCLA layers' norms too)."""
    norm_cfg = dict(type='BN', requires_grad=True) if norm == 'BN' else \
        dict(type='GN', num_groups=32, requires_grad=True)
    kwargs = dict(
        depth=50,
        kcla_drop_path=0.,
        norm_eval=False,
        norm_cfg=norm_cfg,
        zero_init_residual=False)
    plain = KCLAResNet(**kwargs)
    plain.init_weights()
    cp = KCLAResNet(with_cp=True, **kwargs)
    cp.load_state_dict(plain.state_dict())
    assert isinstance(cp.layer1[0].kcla.norm,
                      nn.BatchNorm2d if norm == 'BN' else nn.GroupNorm)
    plain.to(DEVICE)
    cp.to(DEVICE)
    x = torch.randn(2, 3, R50_SIZE, R50_SIZE, device=DEVICE)
    with torch.no_grad():
        grad_outputs = [torch.randn_like(o) for o in plain.eval()(x)]
    want, want_grads, plain_peak = peak_train_step(plain,
                                                   x.clone().requires_grad_(),
                                                   grad_outputs)
    got, got_grads, cp_peak = peak_train_step(cp,
                                              x.clone().requires_grad_(),
                                              grad_outputs)
    for a, b in zip(got, want):
        assert_close_to_max(a, b, FP32_TOL)
    assert len(got_grads) == len(want_grads)
    for a, b in zip(got_grads, want_grads):
        assert_close_to_max(a, b, FP32_GRAD_TOL)
    cuda_only('peak memory (torch.cuda.max_memory_allocated)')
    assert cp_peak <= plain_peak, (
        f'with_cp peak {cp_peak / 2**20:.1f} MiB, without '
        f'{plain_peak / 2**20:.1f} MiB')


@pytest.mark.skipif(
    extension() is None,
    reason='the compiled kernels are not built or KCLA_MM_NO_EXTENSION is '
    'set')
@pytest.mark.parametrize('grad', [True, False])
def test_compiled_on_cuda_fails_naming_the_condition(grad):
    """The kernels are CPU only: 'compiled' asked for on CUDA raises naming
    the condition; 'auto' runs 'fused' there, in a layer and a backbone."""
    cuda_only("the CUDA dispatch ('compiled' runs on the CPU)")
    layer, x, state = make_case('adapt')
    layer.to(DEVICE).train(grad)
    x, state = x.to(DEVICE).requires_grad_(grad), to_device(state)
    layer.implementation = 'compiled'
    condition = re.escape('the input is on the CPU does not hold (input '
                          'torch.float32 on cuda)')
    with torch.set_grad_enabled(grad):
        with pytest.raises(
                RuntimeError, match="implementation='compiled'.*" + condition):
            layer(x, state)
        layer.implementation = 'auto'
        y, _ = layer(x, state)
    assert layer.last_implementation == 'fused'
    assert y.device.type == 'cuda'

    model = KCLAResNet(
        depth=18, base_channels=16, head_dim=8,
        kcla_implementation='compiled').to(DEVICE).train(grad)
    images = torch.rand(2, 3, 64, 64, device=DEVICE)
    with torch.set_grad_enabled(grad):
        with pytest.raises(RuntimeError, match=condition):
            model(images)
        for m in model.modules():
            if isinstance(m, KCLALayer):
                m.implementation = 'auto'
        model(images)
    assert {
        m.last_implementation
        for m in model.modules() if isinstance(m, KCLALayer)
    } == {'fused'}
