"""Every fast path of KCLALayer (kcla_mm/models/layers/kcla_fused.py,
kcla_recompute.py and the compiled kernels of kcla_compiled.py) against the
reference implementation (KCLALayer.forward_reference and the
methods it is written with), piece by piece and whole."""
import copy
import re

import pytest
import torch

from kcla_mm.models import KCLAResNet
from kcla_mm.models.layers import KCLALayer, KCLAState
from kcla_mm.models.layers.attention_branch import (adapt_state,
                                                    build_state_adapter,
                                                    scaled_adapt)
from kcla_mm.models.layers.kcla import IMPLEMENTATIONS, STATE_EPS
from kcla_mm.models.layers.kcla.compiled import compiled_unmet, extension
from kcla_mm.models.layers.kcla.fused import (folded_renormalise, folded_value,
                                              folds_renormalise, fused_forward,
                                              fused_query_key,
                                              fused_renormalise)
from kcla_mm.models.layers.kcla.recompute import recomputed_forward
from helpers import (adapter_case, assert_close_to_max,
                     assert_same_values_and_gradients, gradients, make_case)
from official_reference import randomise_

CASES = ['first', 'carry', 'adapt', 'renorm']


def compiled_layer_forward(layer, x, state):
    """'compiled' where the kernels cover the call; elsewhere asking for
    it is an error that names the condition, and 'auto' runs 'fused'."""
    layer.implementation = 'compiled'
    unmet = compiled_unmet(layer.params(), x, state)
    if unmet is not None:
        with pytest.raises(RuntimeError, match=re.escape(unmet)):
            layer(x, state)
        layer.implementation = 'auto'
    out = layer(x, state)
    assert layer.last_implementation == ('fused' if unmet else 'compiled')
    return out


PATHS = {
    'fused':
    lambda layer, x, state: fused_forward(layer.params(), x, state),
    'recompute':
    lambda layer, x, state: recomputed_forward(layer.params(), x, state),
    'compiled':
    compiled_layer_forward,
}
FORMATS = {
    'contiguous': torch.contiguous_format,
    'channels_last': torch.channels_last
}


def test_fused_query_key(float64):
    layer, x, _ = make_case('first')
    for ours, ref in zip(
            fused_query_key(layer.params(), x), layer.query_key(x)):
        assert ours.shape == ref.shape == (3, 4, 64)
        assert_close_to_max(ours, ref, 1e-12)


@pytest.mark.parametrize('mode', ['train', 'eval'])
@pytest.mark.parametrize('case', ['adapt', 'renorm'])
def test_fused_renormalise(float64, case, mode):
    layer, _, state = make_case(case)
    layer.train(mode == 'train')
    state = KCLAState(state.u.requires_grad_(), state.z.requires_grad_())
    assert_same_values_and_gradients(
        tuple(fused_renormalise(layer.params(), state)),
        tuple(layer.renormalise(state)), tuple(state), layer)


@pytest.mark.parametrize('memory_format', ['contiguous', 'channels_last'])
@pytest.mark.parametrize('stride', [1, 2])
def test_adapt_state_is_the_grouped_conv(float64, stride, memory_format):
    """Algorithm 1's grouped 1x1 conv as a matmul: the module's values and
    gradients, odd sizes included (channels_last runs the module)."""
    conv = build_state_adapter(None, 128, 256, stride, num_heads=4)
    a = torch.rand(
        3, 128, 17,
        13).contiguous(memory_format=FORMATS[memory_format]).requires_grad_()
    ours, ref = adapt_state(conv, a), conv(a)
    assert ours.shape == ref.shape
    assert_same_values_and_gradients((ours, ), (ref, ), (a, ), conv)


@pytest.mark.parametrize('stride', [1, 2])
def test_scaled_adapt_is_the_conv_of_the_scaled_state(float64, stride):
    """Algorithm 1's ``conv(U / Z)`` with the scaling in per-sample
    weights: values and the gradients of the state, the per-channel scales
    and the conv's weights, over odd sizes, with conv groups (8) that split
    the incoming heads (4)."""
    conv = build_state_adapter(None, 128, 256, stride, num_heads=8)
    a = torch.rand(3, 128, 17, 13).requires_grad_()
    in_scale = torch.rand(3, 4).add(0.5).repeat_interleave(
        32, dim=1).requires_grad_()
    ours = scaled_adapt(conv, a, in_scale)
    ref = conv(a * in_scale[..., None, None])
    assert ours.shape == ref.shape
    assert_same_values_and_gradients((ours, ), (ref, ), (a, in_scale), conv)


@pytest.mark.parametrize('n', [1, 3])
@pytest.mark.parametrize('case', ['adapt-stride2', 'adapt-stride1', 'renorm'])
def test_folded_renormalise(float64, case, n):
    """Algorithm 1 in inference as one matmul: the reference's values for a
    strided conv over odd sizes (17x13 -> 9x7), a stride-1 conv (a dilated
    stage) and no conv, with conv groups that split the incoming heads."""
    if case == 'renorm':
        layer, _, state = make_case('renorm', n=n)
    else:
        layer, state = adapter_case(int(case[-1]), n)
    layer.eval()
    with torch.no_grad():
        assert folds_renormalise(layer.params(), state)
        ours, ref = folded_renormalise(layer.params(),
                                       state), layer.renormalise(state)
    assert ours.u.shape == ref.u.shape
    for a, b in zip(ours, ref):
        assert_close_to_max(a, b, 1e-12)


def test_folded_renormalise_only_in_inference():
    """With autograd, a training or non-BN norm, channels_last or autocast,
    Algorithm 1 runs unfolded."""
    layer, _, state = make_case('adapt')
    layer.eval()
    assert not folds_renormalise(layer.params(), state)  # autograd
    with torch.no_grad():
        assert folds_renormalise(layer.params(), state)
        assert not folds_renormalise(
            layer.params(),
            KCLAState(
                state.u.contiguous(memory_format=torch.channels_last),
                state.z))
        with torch.autocast('cpu'):
            assert not folds_renormalise(layer.params(), state)
        layer.train()
        assert not folds_renormalise(layer.params(), state)
        gn_layer, _, _ = make_case('adapt', norm='GN')
        gn_layer.state_norm = torch.nn.GroupNorm(4, 256).eval()
        assert not folds_renormalise(gn_layer.eval().params(), state)


@pytest.mark.parametrize('memory_format', ['contiguous', 'channels_last'])
@pytest.mark.parametrize('n', [1, 3])
@pytest.mark.parametrize('mode', ['train', 'eval'])
@pytest.mark.parametrize('norm', ['BN', 'GN'])
def test_folded_value(float64, norm, mode, n, memory_format):
    """The kernel fold (and, for eval-mode BN, the BN fold) against
    KCLALayer.branch, forward and backward."""
    layer, _, _ = make_case('carry', n=n, norm=norm)
    layer.train(mode == 'train')
    fmt = FORMATS[memory_format]
    u = (torch.rand(n, 256, 9, 7) *
         5).contiguous(memory_format=fmt).requires_grad_()
    z = (torch.rand(n, 4) + 0.5).requires_grad_()
    gate = torch.rand(n, 4).requires_grad_()
    assert_same_values_and_gradients(
        (folded_value(layer.params(), u, gate / (z + STATE_EPS), u.dtype), ),
        (layer.branch(u, z, gate, u.dtype), ), (u, z, gate), layer)


@pytest.mark.parametrize('memory_format', ['contiguous', 'channels_last'])
@pytest.mark.parametrize('n', [1, 3])
@pytest.mark.parametrize('mode', ['train', 'eval'])
@pytest.mark.parametrize('case', CASES)
@pytest.mark.parametrize('zero_init_branch', [False, True])
@pytest.mark.parametrize('path', PATHS)
def test_fused_forward_float64(float64, path, zero_init_branch, case, mode, n,
                               memory_format):
    """The whole layer: outputs, state and every gradient; with
    zero_init_branch, its per-channel scale too (randomised, so not zero).
    'recompute' is the fused path whose backward recomputes the branch
    (kcla_recompute.py; its chains of layers are in test_kcla_recompute.py);
    'compiled' runs the C++ kernels where they apply (here: NCHW) and
    refuses elsewhere, where 'auto' runs the fused path.
    """
    layer, x, state = make_case(case, n=n, zero_init_branch=zero_init_branch)
    layer.train(mode == 'train')
    fmt = FORMATS[memory_format]
    x = x.contiguous(memory_format=fmt).requires_grad_()
    inputs = [x]
    if state is not None:
        state = KCLAState(
            state.u.contiguous(memory_format=fmt).requires_grad_(),
            state.z.requires_grad_())
        inputs += [state.u, state.z]
    y, new_state = PATHS[path](layer, x, state)
    y_ref, state_ref = layer.forward_reference(x, state)
    assert_same_values_and_gradients((y, *new_state), (y_ref, *state_ref),
                                     inputs, layer)


@pytest.mark.parametrize('zero_init_branch', [False, True])
@pytest.mark.parametrize('norm', ['BN', 'GN'])
@pytest.mark.parametrize('case', CASES)
@pytest.mark.parametrize('implementation', ['fused', 'auto'])
def test_fused_inference_leaves_its_inputs_alone(float64, implementation, case,
                                                 norm, zero_init_branch):
    """Without autograd: the reference's values, and the inputs left
    alone ('auto' runs the compiled kernels with BN, where built, the fused
    path with GN)."""
    layer, x, state = make_case(
        case, norm=norm, zero_init_branch=zero_init_branch)
    layer.implementation = implementation
    layer.eval()
    with torch.no_grad():
        y_ref, state_ref = layer.forward_reference(x, state)
        x_in = x.clone()
        state_in = None if state is None else KCLAState(
            state.u.clone(), state.z.clone())
        y, new_state = layer(x_in, state_in)
    for ours, ref in zip((y, *new_state), (y_ref, *state_ref)):
        assert_close_to_max(ours, ref, 1e-12)
    assert y.data_ptr() != x_in.data_ptr()
    assert torch.equal(x_in, x)
    if state is not None:
        assert new_state.u.data_ptr() != state_in.u.data_ptr()
        assert torch.equal(state_in.u, state.u)


# What runs between a forward and its backward. PyTorch's own eval-mode BN
# reads its running statistics when backward runs, so 'fused' (PyTorch ops,
# and 'compiled' without its kernels, where 'auto' runs 'fused') is held to
# the mode flip only; the paths that replay the forward in backward are
# held to both.
BETWEEN = [('fused', 'mode flip'), ('recompute', 'mode flip'),
           ('recompute', 'train forward'), ('compiled', 'mode flip'),
           pytest.param(
               'compiled',
               'train forward',
               marks=pytest.mark.skipif(
                   extension() is None,
                   reason='the compiled kernels are not built or '
                   'KCLA_MM_NO_EXTENSION is set'))]


@pytest.mark.parametrize('mode', ['train', 'eval'])
@pytest.mark.parametrize('case', CASES)
@pytest.mark.parametrize('path, between', BETWEEN)
def test_the_gradient_is_of_the_forward_whatever_runs_before_backward(
        float64, path, between, case, mode):
    """Autograd differentiates what the forward computed: the layer put in
    the other mode before backward ('mode flip'), or a train forward in
    between that updates the norms' running statistics in place ('train
    forward'), changes no gradient. The replay in backward used to read
    the norms' mode and statistics when it ran: after a train forward and
    ``model.eval()``, 'auto' gave a KCLA-ResNet-18 an input gradient 24
    times too large."""
    layer, x, state = make_case(case)
    layer.train(mode == 'train')
    truth = copy.deepcopy(layer)
    x.requires_grad_()
    inputs = [x] if state is None else [x, *state]
    for t in inputs[1:]:
        t.requires_grad_()
    y, new_state = PATHS[path](layer, x, state)
    y_ref, state_ref = truth.forward_reference(x, state)
    refs = (y_ref, *state_ref)
    if between == 'mode flip':
        layer.train(mode != 'train')
    else:
        layer.train()
        other_x, other_state = make_case(case)[1:]
        layer(other_x * 3, other_state)
        assert not torch.equal(layer.norm.running_var, truth.norm.running_var)
        layer.train(mode == 'train')
    grad_outputs = [torch.randn_like(t) for t in refs]
    got = gradients((y, *new_state), inputs + list(layer.parameters()),
                    grad_outputs)
    want = gradients(refs, inputs + list(truth.parameters()), grad_outputs)
    for a, b in zip((y, *new_state), refs):
        assert_close_to_max(a, b, 1e-12)
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert_close_to_max(a, b, 1e-8)


@pytest.mark.parametrize('path', PATHS)
def test_fused_forward_float32_and_drop_path(path):
    """fp32 within 1e-5 of the reference; drop path draws the same mask
    from the same seed on both paths."""
    layer, x, state = make_case('adapt', drop_path=0.5, n=8)
    layer.train()
    torch.manual_seed(1)
    y, new_state = PATHS[path](layer, x.requires_grad_(), state)
    torch.manual_seed(1)
    y_ref, state_ref = layer.forward_reference(x, state)
    for ours, ref in zip((y, *new_state), (y_ref, *state_ref)):
        assert_close_to_max(ours, ref, 1e-5)
    dropped = ((y - x).flatten(1).abs().sum(1) == 0).sum().item()
    assert 0 < dropped < 8


@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float16])
@pytest.mark.parametrize('implementation', IMPLEMENTATIONS)
@pytest.mark.parametrize('mode', ['eval', 'train'])
def test_autocast_keeps_the_state_in_fp32(implementation, mode, dtype):
    layer, x, state = make_case('adapt')
    layer.implementation = implementation
    layer.train(mode == 'train')
    y_ref, state_ref = layer.forward_reference(x, state)
    x.requires_grad_(mode == 'train')
    try:
        with torch.autocast('cpu', dtype=dtype):
            y, new_state = layer(x, state)
    except RuntimeError as exc:  # torch 2.1: no fp16 CPU autocast kernels
        pytest.skip(f'torch {torch.__version__} has no {dtype} CPU autocast '
                    f'kernel here: {exc}')
    assert new_state.u.dtype == new_state.z.dtype == torch.float32
    assert torch.isfinite(y).all() and torch.isfinite(new_state.u).all()
    assert_close_to_max(y.float(), y_ref, 5e-2)
    if mode == 'train':
        (y.float().mean() + new_state.u.mean()).backward()
        assert torch.isfinite(x.grad).all()
        assert all(
            torch.isfinite(p.grad).all() for p in layer.parameters()
            if p.grad is not None)


def test_unknown_implementation_is_named():
    with pytest.raises(ValueError, match="implementation='cuda'"):
        KCLALayer(256, implementation='cuda')
    with pytest.raises(ValueError, match="kcla_implementation='fast'"):
        KCLAResNet(depth=18, head_dim=32, kcla_implementation='fast')


@pytest.mark.parametrize('implementation', ['fused', 'auto'])
def test_backbone_implementations_agree(implementation):
    """KCLAResNet-18 eval features against the reference."""
    ref = randomise_(
        KCLAResNet(
            depth=18,
            base_channels=16,
            head_dim=8,
            kcla_implementation='reference')).eval()
    model = copy.deepcopy(ref)
    for module in model.modules():
        if isinstance(module, KCLALayer):
            module.implementation = implementation
    x = torch.rand(2, 3, 65, 47)
    with torch.no_grad():
        for ours, want in zip(model(x), ref(x)):
            assert_close_to_max(ours, want, 1e-5)


def test_forward_hook_on_a_block_keeps_its_output():
    """Feature extraction with a forward hook on ``layerN.J``: what the
    hook holds is what the block returned (the block calls its KCLA layer,
    so that is the layer's output and state)."""
    model = KCLAResNet(depth=18, base_channels=16, head_dim=8).eval()
    held, copies = {}, {}

    def keep(name):

        def hook(module, args, out):
            held[name] = out[0]
            copies[name] = out[0].clone()

        return hook

    for name in ('layer1.0', 'layer1.1', 'layer3.0'):
        model.get_submodule(name).register_forward_hook(keep(name))
    with torch.no_grad():
        model(torch.rand(2, 3, 64, 64))
    changed = [n for n in held if not torch.equal(held[n], copies[n])]
    assert changed == []
