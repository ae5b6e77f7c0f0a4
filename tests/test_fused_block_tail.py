"""The block tail fused with the KCLA layer in inference
(kcla_mm/models/layers/kcla/block_tail.py): the same features as the
modules run one by one (and as the reference layer), where it applies, and
the modules themselves wherever something could tell the difference."""
import copy

import pytest
import torch
import torch.nn as nn

from kcla_mm.models.backbones.kcla_resnet import KCLAResNet
from kcla_mm.models.backbones.mmseg_resnet import MMSegKCLAResNetV1c
from kcla_mm.models.layers import KCLALayer, KCLAState
from kcla_mm.models.layers.kcla.block_tail import (fused_block_and_kcla,
                                                   tail_fuses)
from helpers import (assert_close_to_max, skip_module_without_extension,
                     small_backbone)
from official_reference import randomise_

skip_module_without_extension('which the fused block tail runs in')

pytestmark = pytest.mark.usefixtures('ext')


def build(name):
    if name == 'mmdet-r18':
        model = small_backbone(KCLAResNet, 18)
    elif name == 'mmdet-r50-caffe':
        model = small_backbone(KCLAResNet, 50, style='caffe')
    else:  # mmseg's ResNetV1c at output stride 8: dilated stride-1 stages
        model = small_backbone(
            MMSegKCLAResNetV1c,
            50,
            strides=(1, 2, 1, 1),
            dilations=(1, 1, 2, 4),
            contract_dilation=True)
    randomise_(model)
    model.eval()
    return model


def stem_input(model, x):
    if model.deep_stem:
        return model.maxpool(model.stem(x))
    return model.maxpool(model.relu(model.norm1(model.conv1(x))))


def walk(model, x):
    """(block, layer, block input, incoming state) of every block, running
    the modules one by one (never the fused path)."""
    calls, state = [], None
    x = stem_input(model, x)
    for name in model.res_layers:
        for block in getattr(model, name):
            calls.append((block, block.kcla, x, state))
            x, state = block.kcla(block.forward_block(x), state)
    return calls


@pytest.mark.parametrize('name', ['mmdet-r18', 'mmdet-r50-caffe', 'mmseg-os8'])
@pytest.mark.parametrize('dtype', [torch.float32, torch.float64])
def test_each_block_gives_what_its_modules_give(name, dtype):
    """Every block of the network, fed the unfused network's input and
    state: fused output and state against block then layer (float64:
    1e-12 of the largest entry; float32: 1e-5)."""
    model = build(name).to(dtype)
    x = torch.rand(2, 3, 67, 53, dtype=dtype)
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    with torch.no_grad():
        calls = walk(model, x)
        for block, layer, block_in, state in calls:
            assert tail_fuses(block, layer, block_in, state)
            state_copy = None if state is None else KCLAState(
                state.u.clone(), state.z.clone())
            want_x, want_state = layer(block.forward_block(block_in), state)
            got_x, got_state = fused_block_and_kcla(block, layer, block_in,
                                                    state)
            assert_close_to_max(got_x, want_x, tol)
            assert_close_to_max(got_state.u, want_state.u, tol)
            assert_close_to_max(got_state.z, want_state.z, tol)
            if state is not None:  # the incoming state is left alone
                assert torch.equal(state.u, state_copy.u)


@pytest.mark.parametrize('name', ['mmdet-r18', 'mmdet-r50-caffe', 'mmseg-os8'])
def test_backbone_features_are_the_reference_layers(name):
    """The whole backbone in inference, fused, against the same weights
    with the reference layer (which never fuses) in float64."""
    torch.set_default_dtype(torch.float64)
    try:
        model = build(name)
        reference = copy.deepcopy(model)
        for module in reference.modules():
            if isinstance(module, KCLALayer):
                module.implementation = 'reference'
        x = torch.rand(2, 3, 67, 53)
        with torch.no_grad():
            outs, refs = model(x), reference(x)
    finally:
        torch.set_default_dtype(torch.float32)
    for out, ref in zip(outs, refs):
        assert_close_to_max(out, ref, 1e-12)


def first_block_case():
    model = build('mmdet-r50-caffe')
    x = torch.rand(2, 3, 67, 53)
    with torch.no_grad():
        block, layer, block_in, state = walk(model, x)[1]
    return model, block, layer, block_in, state


def test_hooks_see_every_call():
    """A forward hook on a block, its last norm, its ReLU or the layer (or
    a global one) turns the fusion off, so that the hook fires as without
    it and gets what the module returns (for the block, which calls its
    layer, the layer's output and state)."""
    model, block, layer, block_in, state = first_block_case()
    with torch.no_grad():
        want = block(block_in, state)
    for module in (block, block.norm3, block.relu, layer):
        seen = []
        handle = module.register_forward_hook(
            lambda m, args, out: seen.append(out))
        try:
            with torch.no_grad():
                assert not tail_fuses(block, layer, block_in, state)
                model(torch.rand(2, 3, 67, 53))
        finally:
            handle.remove()
        assert seen
    handle = nn.modules.module.register_module_forward_hook(
        lambda m, args, out: None)
    try:
        with torch.no_grad():
            assert not tail_fuses(block, layer, block_in, state)
    finally:
        handle.remove()
    seen = []
    handle = block.register_forward_hook(lambda m, args, out: seen.append(out))
    try:
        with torch.no_grad():
            out = block(block_in, state)
    finally:
        handle.remove()
    assert seen[0] is out
    torch.testing.assert_close(out[0], want[0])
    torch.testing.assert_close(out[1].u, want[1].u)
    with torch.no_grad():
        assert tail_fuses(block, layer, block_in, state)


def test_only_plain_inference_fuses():
    """Autograd, train mode, a subclass of the block, plugins, a norm other
    than an eval BatchNorm, the reference layer: the modules run."""
    model, block, layer, block_in, state = first_block_case()
    assert not tail_fuses(block, layer, block_in, state)  # autograd on
    with torch.no_grad():
        assert tail_fuses(block, layer, block_in, state)
        block.train()
        assert not tail_fuses(block, layer, block_in, state)
        block.eval()
        layer.implementation = 'reference'
        assert not tail_fuses(block, layer, block_in, state)
        layer.implementation = 'auto'
        block.with_plugins = True
        assert not tail_fuses(block, layer, block_in, state)
        block.with_plugins = False
        norm = block.norm3
        block.add_module(block.norm3_name, nn.GroupNorm(4, norm.num_features))
        assert not tail_fuses(block, layer, block_in, state)
        block.add_module(block.norm3_name, norm)
        sub = copy.deepcopy(block)
        sub.__class__ = type('Sub', (type(block), ), {})
        assert not tail_fuses(sub, layer, block_in, state)
        assert tail_fuses(block, layer, block_in, state)


HOOK_KINDS = [
    'forward', 'forward_pre', 'forward_with_kwargs', 'forward_always_call',
    'global_forward', 'global_forward_pre'
]


def add_hook(kind, module, seen):
    """Registers a hook of ``kind`` (on ``module``, or on every module for
    the global kinds) that records its calls; returns its handle."""
    if kind == 'forward':
        return module.register_forward_hook(lambda *args: seen.append(1))
    if kind == 'forward_pre':
        return module.register_forward_pre_hook(lambda *args: seen.append(1))
    if kind == 'forward_with_kwargs':
        return module.register_forward_hook(
            lambda *args: seen.append(1), with_kwargs=True)
    if kind == 'forward_always_call':
        return module.register_forward_hook(
            lambda *args: seen.append(1), always_call=True)
    if kind == 'global_forward':
        return nn.modules.module.register_module_forward_hook(
            lambda *args: seen.append(1))
    return nn.modules.module.register_module_forward_pre_hook(
        lambda *args: seen.append(1))


@pytest.mark.parametrize('kind', HOOK_KINDS)
def test_every_kind_of_forward_hook_turns_the_fusion_off(kind):
    """Pins, on each supported torch (CI runs this file on both stacks),
    what block_tail.has_hooks and tail_fuses read from torch's private
    hook dictionaries (torch has no public call that tells whether a
    module has hooks): any forward or forward-pre hook, per module or
    global, keeps the modules running, so the hook fires; once removed,
    the fusion is back."""
    model, block, layer, block_in, state = first_block_case()
    targets = [None] if kind.startswith('global') else [
        block, block.norm3, block.relu, layer
    ]
    for module in targets:
        seen = []
        handle = add_hook(kind, module, seen)
        try:
            with torch.no_grad():
                assert not tail_fuses(block, layer, block_in, state)
                assert layer.forward_with_block(block, block_in, state) is None
                model(torch.rand(2, 3, 67, 53))
        finally:
            handle.remove()
        assert seen
    with torch.no_grad():
        assert tail_fuses(block, layer, block_in, state)
        assert layer.forward_with_block(block, block_in, state) is not None
    assert layer.last_implementation == 'compiled'


def test_the_backbone_asks_the_attention_module():
    """The cross-layer stage imports no KCLA code: it calls whatever
    ``forward_with_block`` the attention module offers."""
    import ast
    import inspect

    from kcla_mm.models.backbones import cross_layer_resnet
    tree = ast.parse(inspect.getsource(cross_layer_resnet))
    imported = [
        node.module or ''
        for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
    ] + [
        alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
        for alias in node.names
    ]
    assert not [name for name in imported if 'kcla' in name.lower()]
    model = small_backbone(KCLAResNet, 18).eval()
    calls = []
    for block in model.layer1:
        block.kcla.forward_with_block = (
            lambda block, x, state: calls.append(block) or None)
    with torch.no_grad():
        model(torch.rand(1, 3, 32, 32))
    assert calls == list(model.layer1)


@pytest.mark.parametrize('name', ['mmdet-r18', 'mmdet-r50-caffe'])
def test_a_kept_conv_output_is_not_written_over(name):
    """The tail writes the block output over its last conv's output only
    where nothing can hold that: a forward hook on that conv (which turns
    only the in-place write off, not the fusion) keeps its output as the
    conv returned it, and the features are the same either way."""
    model = build(name)
    x = torch.rand(2, 3, 67, 53)
    with torch.no_grad():
        want = model(x)
        for block, layer, block_in, state in walk(model, x):
            conv = block.conv3 if hasattr(block, 'conv3') else block.conv2
            kept = []
            handle = conv.register_forward_hook(
                lambda m, args, out: kept.append((out, out.clone())))
            try:
                assert tail_fuses(block, layer, block_in, state)
                fused_block_and_kcla(block, layer, block_in, state)
            finally:
                handle.remove()
            (out, as_returned), = kept
            assert torch.equal(out, as_returned)
        got = model(x)
    for g, w in zip(got, want):
        assert torch.equal(g, w)


def test_only_a_state_of_its_own_is_written_over():
    """compiled_forward writes U^t over Algorithm 1's new state, which it
    made, and over nothing else (owns_new_state)."""
    from kcla_mm.models.layers.kcla.compiled import owns_new_state
    x = torch.rand(2, 8, 5, 5)
    incoming = torch.rand(2, 8, 5, 5)
    assert owns_new_state(torch.rand(2, 8, 5, 5), incoming, x)
    assert not owns_new_state(incoming, incoming, x)
    assert not owns_new_state(incoming.view(2, 8, 5, 5), incoming, x)
    assert not owns_new_state(torch.rand(2, 8, 6, 5)[:, :, :5], incoming, x)
    assert not owns_new_state(
        torch.rand(2, 8, 5, 5).contiguous(memory_format=torch.channels_last),
        incoming, x)
    assert not owns_new_state(torch.rand(2, 8, 5, 5).double(), incoming, x)
    assert not owns_new_state(torch.rand(2, 8, 4, 4), incoming, x)
    assert not owns_new_state(
        torch.rand(2, 8, 5, 5, requires_grad=True), incoming, x)
    assert not owns_new_state(
        torch.rand(100)[50:].view(2, 1, 5, 5), incoming[:, :1], x[:, :1])
