"""kcla_recompute_outputs (kcla_mm/models/layers/kcla/recomputed_input.py):
the next block's convs recompute a KCLA layer's output in backward instead
of keeping it. The same outputs, gradients and BN statistics bit for bit as
the backbone that keeps it, the activation memory it saves, nothing left
cached after backward, and every case where it must stand aside."""
import copy

import pytest
import torch
from mmengine.registry import MODELS

from kcla_mm.analysis.complexity import saved_activation_bytes
from kcla_mm.models import KCLAResNet
from kcla_mm.models.backbones.errors import BackboneTypeError
from kcla_mm.models.backbones.mmseg_resnet import MMSegKCLAResNetV1c
from kcla_mm.models.layers.kcla.compiled import extension
from kcla_mm.models.layers.kcla.recomputed_input import RecomputedInputConv
from helpers import blocks, graph_nodes
from official_reference import randomise_

pytestmark = pytest.mark.skipif(
    extension() is None,
    reason='the compiled kernels are not built or KCLA_MM_NO_EXTENSION is '
    'set: the option then leaves every block as it is (tested below)')

SETTINGS = {
    'bn': dict(norm_eval=False),
    'detection': dict(frozen_stages=1, norm_eval=True),
    'warm_start': dict(norm_eval=False, zero_init_attention=True),
}


def twins(depth, cls=KCLAResNet, **kwargs):
    """(keeps outputs, recomputes them): randomised, equal weights."""
    common = dict(depth=depth, base_channels=8, head_dim=8, kcla_drop_path=0.3)
    common.update(kwargs)
    keeps = randomise_(cls(kcla_recompute_outputs=False, **common))
    recomputes = cls(**common)  # the default
    recomputes.load_state_dict(keeps.state_dict())
    return keeps, recomputes


def step(model, x, grads, seed=3, retain=False, backwards=1):
    model.train()
    model.zero_grad(set_to_none=True)
    x.grad = None
    torch.manual_seed(seed)  # the same drop-path masks for both
    outs = model(x)
    nodes = graph_nodes(outs, RecomputedInputConv)
    for i in range(backwards):
        torch.autograd.backward(
            outs, grads, retain_graph=retain or i + 1 < backwards)
    params = [x] + [p for p in model.parameters() if p.requires_grad]
    return outs, [p.grad for p in params], nodes


@pytest.mark.parametrize('dtype', [torch.float32, torch.float64])
@pytest.mark.parametrize('setting', sorted(SETTINGS))
@pytest.mark.parametrize('depth', [18, 50, 101])
def test_bit_for_bit_the_backbone_that_keeps_them(depth, setting, dtype):
    """Odd sizes, drop path, R101's mid-stage re-normalisation: outputs,
    every gradient and the BN statistics torch.equal; the convs of every
    block whose input comes from a trained KCLA layer recompute it (two
    at each stage's first block: conv1 and the downsample conv), and
    nothing stays cached once backward is done."""
    keeps, recomputes = (
        m.to(dtype) for m in twins(depth, **SETTINGS[setting]))
    x = torch.randn(2, 3, 45, 39, dtype=dtype, requires_grad=True)
    with torch.no_grad():
        grads = [torch.randn_like(o) for o in copy.deepcopy(keeps).train()(x)]
    out_k, grad_k, none = step(keeps, x, grads)
    out_r, grad_r, nodes = step(recomputes, x, grads)
    assert not none
    for a, b in zip(list(out_k) + grad_k, list(out_r) + grad_r):
        assert torch.equal(a, b)
    for a, b in zip(keeps.buffers(), recomputes.buffers()):
        assert torch.equal(a, b)
    # Every block after the first (x requires grad: so do the frozen
    # stage's outputs).
    expected = sum(1 + (b.downsample is not None) for b in blocks(keeps)[1:])
    assert len(nodes) == expected
    for node in nodes:
        assert node.source.out is None
        assert not node.source.node().tape.cache


def test_twice_through_a_retained_graph():
    """A second backward pass recomputes the states and outputs again (the
    first one took them) and accumulates the same gradients."""
    keeps, recomputes = twins(50, norm_eval=False)
    x = torch.randn(2, 3, 40, 40, requires_grad=True)
    with torch.no_grad():
        grads = [torch.randn_like(o) for o in copy.deepcopy(keeps).train()(x)]
    _, grad_k, _ = step(keeps, x, grads, backwards=2)
    _, grad_r, nodes = step(recomputes, x, grads, backwards=2)
    assert nodes
    for a, b in zip(grad_k, grad_r):
        assert torch.equal(a, b)


@pytest.mark.parametrize('depth', [50, 101])
def test_activation_memory_of_resnet(depth):
    """The saved-tensor bytes fall by at least the KCLA outputs the next
    blocks' convs would keep (one per block after the first), to within
    8% of mmdet's ResNet's (at this small size the per-stage tensors of
    Algorithm 1 count for more than at 224x224, where it is 2%)."""
    keeps, recomputes = twins(depth, norm_eval=False, base_channels=16)
    resnet = MODELS.build(
        dict(
            type='mmdet.ResNet',
            depth=depth,
            base_channels=16,
            norm_eval=False))
    x = torch.randn(2, 3, 64, 64)
    feats = []
    hooks = [
        b.register_forward_hook(lambda m, i, o: feats.append(o[0]))
        for b in blocks(keeps)
    ]
    with torch.no_grad():
        keeps.train()(x)
    for hook in hooks:
        hook.remove()
    outputs = sum(f.numel() * f.element_size() for f in feats[:-1])
    kept = saved_activation_bytes(keeps, x)
    recomputed = saved_activation_bytes(recomputes, x)
    assert kept - recomputed >= outputs
    resnet.train()  # mmdet's ResNet.train() returns None
    assert recomputed <= 1.08 * saved_activation_bytes(resnet, x)


def uses_it(model, x) -> bool:
    model.train()
    outs = model(x)
    return bool(graph_nodes(outs, RecomputedInputConv))


@pytest.mark.parametrize('case', [
    'with_cp', 'conv1_hook', 'avg_down', 'fused', 'channels_last', 'option_off'
])
def test_stands_aside(case):
    """Where the block would not compute what its modules compute (a hook
    on a conv it replaces, avg_down's pooling that keeps its input), keeps
    its body in a checkpoint, or its input is not the kernels' output, the
    block runs as its modules."""
    kwargs = dict(
        depth=50,
        base_channels=8,
        head_dim=8,
        norm_eval=False,
        kcla_recompute_outputs=case != 'option_off')
    if case == 'with_cp':
        kwargs['with_cp'] = True
    if case == 'avg_down':
        kwargs.update(avg_down=True, deep_stem=True)
    if case == 'fused':
        kwargs['kcla_implementation'] = 'fused'
    model = KCLAResNet(**kwargs)
    # Not smaller: a 1x1 channels_last tensor is also contiguous, and the
    # kernels then take it.
    x = torch.randn(2, 3, 64, 64, requires_grad=True)
    if case == 'conv1_hook':
        for block in blocks(model):
            block.conv1.register_forward_hook(lambda *args: None)
    if case == 'channels_last':
        model = model.to(memory_format=torch.channels_last)
        x = x.detach().contiguous(
            memory_format=torch.channels_last).requires_grad_()
    assert not uses_it(model, x) or case == 'avg_down'
    if case == 'avg_down':
        # Blocks without a downsample still recompute; those with
        # avg_down's pooling run as modules.
        outs = model(x)
        nodes = graph_nodes(outs, RecomputedInputConv)
        assert len(nodes) == sum(
            b.downsample is None for b in blocks(model)[1:])


def test_control_uses_it():
    """The cases of test_stands_aside are told apart from one that uses
    it."""
    model = KCLAResNet(
        depth=50,
        base_channels=8,
        head_dim=8,
        norm_eval=False,
        kcla_recompute_outputs=True)
    assert uses_it(model, torch.randn(2, 3, 32, 32))


def test_mmseg_backbone():
    """mmseg's KCLAResNetV1c (deep stem, mmseg's blocks) as well."""
    keeps, recomputes = twins(50, cls=MMSegKCLAResNetV1c, norm_eval=False)
    x = torch.randn(2, 3, 40, 40, requires_grad=True)
    with torch.no_grad():
        grads = [torch.randn_like(o) for o in copy.deepcopy(keeps).train()(x)]
    _, grad_k, _ = step(keeps, x, grads)
    _, grad_r, nodes = step(recomputes, x, grads)
    assert nodes
    for a, b in zip(grad_k, grad_r):
        assert torch.equal(a, b)


def test_bad_value_names_the_key():
    with pytest.raises(BackboneTypeError, match='kcla_recompute_outputs'):
        KCLAResNet(depth=18, kcla_recompute_outputs='yes')


def test_eval_is_unchanged():
    """Inference keeps nothing: the option changes nothing there."""
    keeps, recomputes = (m.eval() for m in twins(50))
    x = torch.randn(1, 3, 40, 40)
    with torch.no_grad():
        for a, b in zip(keeps(x), recomputes(x)):
            assert torch.equal(a, b)


def test_deepcopy_and_state_dict_keys():
    """The option adds no parameter or buffer."""
    keeps, recomputes = twins(18)
    assert list(keeps.state_dict()) == list(recomputes.state_dict())
    assert copy.deepcopy(recomputes).layer1[0].kcla.recompute_block_input
