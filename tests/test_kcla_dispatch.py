"""Which KCLA implementation runs a call (kcla_mm/models/layers/kcla/
dispatch.py): one row of the table per condition, the layer's report of
what ran, and 'compiled' asked for where it cannot run, which fails naming
the condition."""
import re

import pytest
import torch

from kcla_mm.models.layers import KCLALayer, KCLAState
from kcla_mm.models.layers.kcla import select_implementation
from kcla_mm.models.layers.kcla.compiled import extension
from helpers import assert_close_to_max, gradients, incoming_state, make_case

requires_extension = pytest.mark.skipif(
    extension() is None,
    reason='the compiled kernels are not built or KCLA_MM_NO_EXTENSION is '
    'set')


def layer_and_input(implementation, norm='BN', train=True):
    norm_cfg = dict(
        type='GN', num_groups=4) if norm == 'GN' else dict(type='BN')
    layer = KCLALayer(
        256, implementation=implementation, drop_path=0., norm_cfg=norm_cfg)
    layer.train(train)
    return layer, torch.rand(2, 256, 9, 7), incoming_state('carry', 2)


def selected(layer, x, state):
    """What the table selects for ``layer(x, state)``."""
    return select_implementation(layer.implementation, layer.params(), x,
                                 state)


def runs(layer, x, state, grad=True):
    """What the table selects, and what the layer then reports."""
    with torch.set_grad_enabled(grad):
        chosen = selected(layer, x, state)
        layer(x.requires_grad_(grad), state)
    assert layer.last_implementation == chosen
    return chosen


@pytest.mark.parametrize('grad', [True, False])
def test_reference_and_fused_run_as_asked(grad):
    for implementation in ('reference', 'fused'):
        layer, x, state = layer_and_input(implementation)
        assert runs(layer, x, state, grad) == implementation


def test_recompute_runs_in_train_steps_only():
    layer, x, state = layer_and_input('recompute')
    assert runs(layer, x, state) == 'recompute'
    assert runs(layer, x, state, grad=False) == 'fused'
    with torch.autocast('cpu'):
        assert runs(layer, x, state) == 'fused'
    for p in layer.parameters():
        p.requires_grad_(False)
    with torch.no_grad():
        assert selected(layer, x, state) == 'fused'


@requires_extension
@pytest.mark.parametrize('grad', [True, False])
def test_auto_runs_the_kernels_where_they_apply(grad):
    layer, x, state = layer_and_input('auto')
    assert runs(layer, x, state, grad) == 'compiled'
    assert runs(layer, x.contiguous(memory_format=torch.channels_last), state,
                grad) == 'fused'
    gn_layer, _, _ = layer_and_input('auto', norm='GN')
    assert runs(gn_layer, x, state, grad) == 'fused'
    with torch.autocast('cpu'):
        assert selected(layer, x, state) == 'fused'
    assert runs(layer.double(), x.double(), None, grad) == 'compiled'


def test_auto_without_the_kernels_runs_fused(monkeypatch):
    monkeypatch.setenv('KCLA_MM_NO_EXTENSION', '1')
    layer, x, state = layer_and_input('auto')
    assert runs(layer, x, state) == 'fused'
    assert runs(layer, x, state, grad=False) == 'fused'


@requires_extension
@pytest.mark.parametrize('case, condition', [
    ('channels_last', 'the input is contiguous (NCHW)'),
    ('GN', 'the norm is a BatchNorm (not SyncBN)'),
    ('bf16', 'the input is fp32 or fp64'),
    ('autocast', 'CPU autocast is off'),
    ('trace', 'not exporting or tracing (torch.jit.trace, '
     'torch.onnx.export, torch.export)'),
    ('no extension', 'the C++ extension is available'),
])
def test_compiled_asked_for_fails_naming_the_condition(monkeypatch, case,
                                                       condition):
    """Instead of quietly running 'fused'."""
    layer, x, state = layer_and_input(
        'compiled', norm='GN' if case == 'GN' else 'BN', train=False)
    if case == 'channels_last':
        x = x.contiguous(memory_format=torch.channels_last)
    elif case == 'bf16':
        layer, x = layer.bfloat16(), x.bfloat16()
    elif case == 'no extension':
        monkeypatch.setenv('KCLA_MM_NO_EXTENSION', '1')

    def call():
        with torch.no_grad(), torch.autocast(
                'cpu', enabled=case == 'autocast'):
            if case == 'trace':
                torch.jit.trace(lambda t: layer(t, None)[0], (x, ))
            else:
                layer(x, state)

    with pytest.raises(
            RuntimeError,
            match=r"implementation='compiled'.*" + re.escape(condition) +
            ' does not hold'):
        call()


def test_implementations_read_the_bundle_not_the_module():
    """The fast paths compute from the KCLAParams they are given: a layer
    whose modules changed after the bundle was made does not change what
    the bundle gives."""
    from kcla_mm.models.layers.kcla.fused import fused_forward
    layer, x, state = layer_and_input('fused', train=False)
    params = layer.params()
    with torch.no_grad():
        expected = fused_forward(params, x, state)
        for module in (layer.query_conv, layer.key_conv, layer.value_conv,
                       layer.head_mix):
            module.weight = torch.nn.Parameter(torch.zeros_like(module.weight))
        layer.norm = torch.nn.Identity()
        got = fused_forward(params, x, state)
        changed = fused_forward(layer.params(), x, state)
    for a, b in zip((got[0], *got[1]), (expected[0], *expected[1])):
        assert torch.equal(a, b)
    assert not torch.equal(changed[0], expected[0])


def attribute_reads(layer):
    """What each module-held field of ``layer.params()`` should be, read by
    plain attribute access."""
    renorm = layer.renorm
    return dict(
        query_weight=layer.query_conv.weight,
        key_weight=layer.key_conv.weight,
        head_mix=layer.head_mix.weight,
        tau=layer.tau,
        value_weight=layer.value_conv.weight,
        norm=layer.norm,
        branch_scale=layer.branch_scale,
        state_adapt=layer.state_adapt if renorm else None,
        state_norm=layer.state_norm if renorm else None,
        state_key_conv=layer.state_key_conv if renorm else None)


@pytest.mark.parametrize('state_stride', [1, 2])
def test_params_find_what_attribute_access_finds(state_stride):
    """KCLALayer.params reads its children from ``Module._modules``, not
    by attribute access: the same objects, also after children are
    replaced, an adapter set where there was None, SyncBN conversion, and a
    parameter turned into a plain tensor attribute (FSDP's views)."""
    layer = KCLALayer(
        64,
        head_dim=16,
        renorm=True,
        state_channels=64 * state_stride,
        state_stride=state_stride,
        zero_init_branch=state_stride == 2)

    def check():
        params = layer.params()
        for name, want in attribute_reads(layer).items():
            assert getattr(params, name) is want, name

    check()
    assert (layer.state_adapt is None) == (state_stride == 1)
    layer.value_conv = torch.nn.Conv2d(64, 64, 3, padding=1, groups=64)
    layer.norm = torch.nn.Identity()
    layer.state_adapt = torch.nn.Conv2d(
        64 * state_stride, 64, 1, stride=state_stride, bias=False)
    check()
    layer = torch.nn.SyncBatchNorm.convert_sync_batchnorm(layer)
    assert isinstance(layer.state_norm, torch.nn.SyncBatchNorm)
    check()
    del layer.key_conv.weight
    layer.key_conv.weight = torch.ones(1, 1, 3)
    check()


def test_state_unpacks_as_the_pair_and_carries_its_tape():
    """``u, z = state`` is the paper's pair; a recomputing train step puts
    its tape in the explicit ``tape`` field, the other paths leave it
    None."""
    layer, x, state = layer_and_input('recompute')
    _, out = layer(x.requires_grad_(), state)
    u, z = out
    assert u is out.u and z is out.z
    assert out.tape is not None and out.tape[1] == 1
    layer.implementation = 'fused'
    assert layer(x, state)[1].tape is None


@pytest.mark.parametrize('case', ['carry', 'renorm', 'adapt'])
@pytest.mark.parametrize('implementation', [
    'fused', 'recompute',
    pytest.param('compiled', marks=requires_extension),
    pytest.param('auto', marks=requires_extension)
])
def test_a_state_that_requires_grad_gets_its_gradient(case, implementation):
    """A frozen layer called on its own with a detached input still passes
    the gradient back to an incoming state that requires grad, as the
    reference does; the kernels and the recomputing node run it themselves
    rather than dropping to a path without autograd (which left the output
    detached) or to 'fused'."""
    layer, x, state = make_case(case, n=2)
    layer = layer.double().train().requires_grad_(False)
    x = x.double()
    inputs = [t.double().requires_grad_() for t in state]
    layer.implementation = 'reference'
    refs = layer(x, KCLAState(*inputs))
    layer.implementation = implementation
    ours = layer(x, KCLAState(*inputs))
    assert layer.last_implementation == ('compiled' if implementation == 'auto'
                                         else implementation)
    refs, ours = (refs[0], *refs[1]), (ours[0], *ours[1])
    assert all(t.requires_grad for t in ours)
    for a, b in zip(ours, refs):
        assert_close_to_max(a, b, 1e-12)
    grads = [torch.randn_like(t) for t in refs]
    for a, b in zip(
            gradients(ours, inputs, grads), gradients(refs, inputs, grads)):
        assert b.abs().max() > 0
        assert_close_to_max(a, b, 1e-10)
