"""zero_init_attention: starting the layer-attention backbones from plain
ResNet weights (torchvision keys), as people will while no KCLA ImageNet
checkpoint is published."""
import os.path as osp

import pytest
import torch
from mmdet.models.backbones import ResNet

from kcla_mm.models import (KCLAResNet, KCLAResNetCIFAR, LAResNet,
                            LAResNetCIFAR, MRLALightResNet,
                            MRLALightResNetCIFAR, ResNetCIFAR)
from kcla_mm.models.layers import KCLALayer, LALayer, MRLALightLayer
from kcla_mm.models.layers.la_layer import LAState
from helpers import ROOT, assert_close_to_max, incoming_state
from official_reference import randomise_

BACKBONES = (KCLAResNet, LAResNet, MRLALightResNet)
CIFAR_BACKBONES = (KCLAResNetCIFAR, LAResNetCIFAR, MRLALightResNetCIFAR)
WARM_CONFIG = osp.join(
    ROOT, 'configs/kcla/faster-rcnn_kcla-r50-warmstart_fpn_1x_coco.py')


def plain_resnet_file(path, depth, cls=ResNet, **kwargs):
    """A torchvision-layout ResNet checkpoint (mmdet's ResNet keys are
    torchvision's, see test_the_plain_file_has_torchvision_key_names; plus
    the fc head, which the backbones must ignore) with random weights and BN
    statistics, so that equal outputs cannot come from an identity init."""
    resnet = randomise_(cls(depth=depth, **kwargs))
    state = dict(resnet.state_dict())
    width = resnet.feat_dim
    state['fc.weight'] = torch.randn(1000, width)
    state['fc.bias'] = torch.randn(1000)
    torch.save(state, path)
    return str(path)


def loaded(cls, path, depth, **kwargs):
    """``cls`` initialised from ``path`` the way a config does it."""
    model = cls(
        depth=depth,
        init_cfg=dict(type='Pretrained', checkpoint=path),
        **kwargs)
    model.init_weights()
    return model


def branch_scales(model):
    return [
        p for n, p in model.named_parameters() if n.endswith('.branch_scale')
    ]


def assert_same_stage_outputs(model, plain, x, mode):
    """Bit for bit, except for KCLA in inference, whose compiled kernels
    compute each block's last BatchNorm in their own order (the block end
    fused with the layer): there within float rounding."""
    model.train(mode == 'train')
    plain.train(mode == 'train')
    with torch.no_grad():
        got, want = model(x), plain(x)
    assert len(got) == len(want)
    fused = mode == 'eval' and any(
        isinstance(m, KCLALayer) for m in model.modules())
    for a, b in zip(got, want):
        if fused:
            torch.testing.assert_close(
                a, b, rtol=1e-6, atol=1e-6 * b.abs().max().item())
        else:
            assert torch.equal(a, b)


@pytest.mark.parametrize('cls', BACKBONES)
@pytest.mark.parametrize('depth', [18, 50])
@pytest.mark.parametrize('mode', ['eval', 'train'])
def test_starts_as_the_plain_resnet_it_was_loaded_from(cls, depth, mode,
                                                       tmp_path):
    # R18 at full width; R50 narrowed (base 16) to keep the test fast.
    width = dict(base_channels=16) if depth == 50 else {}
    head_dim = 16 if depth == 50 else 32
    path = plain_resnet_file(tmp_path / 'resnet.pth', depth, **width)
    model = loaded(
        cls,
        path,
        depth,
        head_dim=head_dim,
        zero_init_attention=True,
        norm_eval=False,
        **width)
    plain = loaded(ResNet, path, depth, norm_eval=False, **width)
    # Train mode too: BN batch statistics and the branches' drop path
    # (default 0.2) leave a zero branch at zero.
    assert_same_stage_outputs(model, plain, torch.rand(2, 3, 64, 64), mode)
    scales = branch_scales(model)
    assert len(scales) == sum(model.stage_blocks)
    assert all(not s.any() for s in scales)


@pytest.mark.parametrize('cls', CIFAR_BACKBONES)
@pytest.mark.parametrize('mode', ['eval', 'train'])
def test_cifar_layout_starts_as_the_plain_cifar_resnet(cls, mode, tmp_path):
    """The CIFAR classes take the option through their **kwargs."""
    path = plain_resnet_file(tmp_path / 'resnet.pth', 11, cls=ResNetCIFAR)
    model = loaded(cls, path, 11, zero_init_attention=True)
    plain = loaded(ResNetCIFAR, path, 11)
    assert len(branch_scales(model)) == 3
    assert_same_stage_outputs(model, plain, torch.rand(2, 3, 32, 32), mode)


def test_the_plain_file_has_torchvision_key_names(tmp_path):
    torchvision = pytest.importorskip(
        'torchvision', reason='torchvision is in the torch 2.1.2 stack')
    for depth in (18, 50):
        path = plain_resnet_file(tmp_path / f'r{depth}.pth', depth)
        reference = getattr(torchvision.models, f'resnet{depth}')()
        assert set(torch.load(path)) == set(reference.state_dict())


@pytest.mark.parametrize('cls', BACKBONES)
def test_the_branches_learn_from_zero(cls, tmp_path):
    path = plain_resnet_file(tmp_path / 'resnet.pth', 18, base_channels=16)
    kwargs = dict(base_channels=16, norm_eval=False)
    model = loaded(
        cls, path, 18, zero_init_attention=True, head_dim=16, **kwargs)
    plain = loaded(ResNet, path, 18, **kwargs)
    norm = model.layer4[1].get_submodule(cls.attention_name).norm
    norm_weight_before = norm.weight.detach().clone()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.rand(4, 3, 64, 64)
    target = [torch.randn_like(o) for o in model(x)]
    for _ in range(3):
        optimizer.zero_grad()
        loss = sum(((o - t)**2).mean() for o, t in zip(model(x), target))
        loss.backward()
        optimizer.step()
    assert all(s.abs().sum() > 0 for s in branch_scales(model))
    # And what is before the scale trains too: once the scale is no
    # longer zero, gradients reach the branch.
    assert not torch.equal(norm.weight, norm_weight_before)
    model.eval()
    plain.eval()
    with torch.no_grad():
        assert not torch.equal(model(x)[-1], plain(x)[-1])


def adapting_layer(kind, **kwargs):
    """A randomised layer of ``kind`` at a stage boundary (128 -> 256
    channels, 17x13 -> 9x7) and the state it receives, for 3 samples."""
    boundary = dict(state_channels=128, state_stride=2, drop_path=0.)
    if kind == 'kcla':
        layer = KCLALayer(256, renorm=True, **boundary, **kwargs)
        state = incoming_state('adapt', 3)
    elif kind == 'la':
        layer = LALayer(256, **boundary, **kwargs)
        state = LAState(torch.randn(3, 1, 128), (torch.rand(3, 128, 17, 13), ))
    else:
        layer = MRLALightLayer(256, **boundary, **kwargs)
        state = torch.rand(3, 128, 17, 13)
    return randomise_(layer).train(), state


def branch_gradients(layer, state):
    """The gradient of every parameter of ``layer`` after one backward
    pass of a random projection of its output; and that output minus its
    input."""
    x = torch.rand(3, 256, 9, 7)
    y, _ = layer(x, state)
    (y * torch.randn_like(y)).sum().backward()
    return {
        n: torch.zeros_like(p) if p.grad is None else p.grad
        for n, p in layer.named_parameters()
    }, y - x


@pytest.mark.parametrize('kind', ['kcla', 'la', 'mrla_light'])
def test_a_zero_norm_weight_would_leave_the_branch_dead(kind):
    """Why zero_init_attention adds a scale instead of zeroing the branch's
    output norm: KCLA's and LA's branches end in ReLU(Norm(.)); with the
    norm's weight and bias at 0 the ReLU sees exactly 0, where its gradient
    is 0, so nothing in the branch (the norm included) ever receives a
    gradient. MRLA-light's branch has no ReLU: there the norm would learn
    (as the docstrings say)."""
    layer, state = adapting_layer(kind)
    torch.nn.init.zeros_(layer.norm.weight)
    torch.nn.init.zeros_(layer.norm.bias)
    grads, branch = branch_gradients(layer, state)
    assert not branch.any()
    norm_grads = [grads['norm.weight'], grads['norm.bias']]
    if kind == 'mrla_light':
        assert all(g.any() for g in norm_grads)
    else:
        dead = {n: g.abs().max().item() for n, g in grads.items()}
        assert not any(dead.values()), dead
    # With the scale instead, the branch also starts at exactly zero, and
    # the scale gets the branch output as its gradient (zero only in a
    # channel that the ReLU zeroes everywhere).
    layer, state = adapting_layer(kind, zero_init_branch=True)
    torch.nn.init.zeros_(layer.branch_scale)
    grads, branch = branch_gradients(layer, state)
    assert not branch.any()
    assert grads['branch_scale'].any()


def test_every_kcla_implementation_honours_the_scale(float64):
    """The backbone with randomised (non-zero) scales: the default path
    against the reference, outputs and every gradient,
    to 1e-10 (outputs) and 1e-8 (gradients) of the largest entry, 8 layers
    deep (the layer-level parity is in test_kcla_fused.py)."""
    kwargs = dict(
        depth=18,
        base_channels=16,
        head_dim=16,
        kcla_drop_path=0.,
        zero_init_attention=True,
        norm_eval=False)
    reference = randomise_(
        KCLAResNet(kcla_implementation='reference', **kwargs))
    fused = KCLAResNet(**kwargs)
    fused.load_state_dict(reference.state_dict())
    assert all(s.abs().min() > 0 for s in branch_scales(fused))
    x = torch.rand(2, 3, 32, 32, requires_grad=True)
    for mode in ('train', 'eval'):
        reference.train(mode == 'train')
        fused.train(mode == 'train')
        want, got = reference(x), fused(x)
        weights = [torch.randn_like(o) for o in want]
        params = [x] + list(reference.parameters())
        want_grads = torch.autograd.grad(want, params, weights)
        got_grads = torch.autograd.grad(got, [x] + list(fused.parameters()),
                                        weights)
        for a, b in zip(got, want):
            assert_close_to_max(a, b, 1e-10)
        for a, b in zip(got_grads, want_grads):
            assert_close_to_max(a, b, 1e-8)
    with torch.no_grad():  # inference without autograd
        for a, b in zip(fused(x.detach()), reference(x.detach())):
            assert_close_to_max(a, b, 1e-10)


@pytest.mark.parametrize('cls', BACKBONES + CIFAR_BACKBONES)
def test_off_by_default_with_no_extra_parameter(cls):
    kwargs = dict(depth=11) if cls in CIFAR_BACKBONES else dict(
        depth=18, base_channels=16, head_dim=16)
    default = cls(**kwargs)
    assert not [k for k in default.state_dict() if 'branch_scale' in k]
    warm = cls(zero_init_attention=True, **kwargs)
    extra = set(warm.state_dict()) - set(default.state_dict())
    assert extra and all(k.endswith('.branch_scale') for k in extra)
    assert set(default.state_dict()) <= set(warm.state_dict())


def test_parameter_counts_of_kcla_r50():
    """Off: the official KCLA-R50 classifier's 25,850,133 parameters (the
    backbone plus a 2048 -> 1000 fc). On: one scale per channel of every
    block output on top."""
    default = KCLAResNet(depth=50)
    warm = KCLAResNet(depth=50, zero_init_attention=True)

    def count(model):
        return sum(p.numel() for p in model.parameters())

    assert count(default) + 2048 * 1000 + 1000 == 25_850_133
    widths = [64 * 2**i * 4 for i in range(4)]
    extra = sum(n * w for n, w in zip(default.stage_blocks, widths))
    assert count(warm) - count(default) == extra == 15_104


def test_warm_start_detection_config():
    from mmdet.registry import MODELS
    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    cfg = Config.fromfile(WARM_CONFIG)
    backbone = cfg.model.backbone
    assert backbone.type == 'KCLAResNet' and backbone.zero_init_attention
    assert backbone.init_cfg == dict(
        type='Pretrained', checkpoint='torchvision://resnet50')
    # Otherwise the mmdet Faster R-CNN R50 1x config.
    import mmdet
    mmdet_cfg = Config.fromfile(
        osp.join(
            osp.dirname(mmdet.__file__), '.mim', 'configs', 'faster_rcnn',
            'faster-rcnn_r50_fpn_1x_coco.py'))
    assert mmdet_cfg.model.backbone.init_cfg == backbone.init_cfg
    for key in ('depth', 'num_stages', 'out_indices', 'frozen_stages',
                'norm_cfg', 'norm_eval', 'style'):
        assert backbone[key] == mmdet_cfg.model.backbone[key], key
    for key in ('neck', 'rpn_head', 'roi_head', 'train_cfg', 'test_cfg'):
        assert cfg.model[key] == mmdet_cfg.model[key], key
    assert [{
        k: v
        for k, v in s.items() if k != '_scope_'
    } for s in cfg.param_scheduler] == mmdet_cfg.param_scheduler
    init_default_scope('mmdet')
    cfg.model.backbone.init_cfg = None
    model = MODELS.build(cfg.model)
    assert len(branch_scales(model.backbone)) == 16


def test_warm_start_detector_from_a_local_resnet50_file(tmp_path):
    """The config with its checkpoint swapped for a local file, as
    ``--cfg-options model.backbone.init_cfg.checkpoint=PATH`` does: the
    detector's init_weights() gives a backbone with mmdet's R50 features."""
    from mmdet.registry import MODELS
    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    path = plain_resnet_file(tmp_path / 'resnet50.pth', 50)
    cfg = Config.fromfile(WARM_CONFIG)
    cfg.merge_from_dict({'model.backbone.init_cfg.checkpoint': path})
    init_default_scope('mmdet')
    detector = MODELS.build(cfg.model)
    detector.init_weights()
    plain_cfg = {
        k: v
        for k, v in cfg.model.backbone.items()
        if k not in ('type', 'zero_init_attention', 'init_cfg')
    }
    plain = loaded(ResNet, path, **plain_cfg)
    assert_same_stage_outputs(detector.backbone, plain,
                              torch.rand(1, 3, 64, 64), 'eval')
    # frozen_stages=1 (mmdet's R50 setting) freezes stage 1's branches at
    # zero with the rest of the stage; the others train.
    trainable = [s.requires_grad for s in branch_scales(detector.backbone)]
    assert trainable == [False] * 3 + [True] * 13


def test_the_config_checkpoint_name_resolves_in_torchvision():
    """torchvision://resnet50 needs torchvision (the torch 2.1.2 stack has
    it) to name a URL; nothing is downloaded."""
    pytest.importorskip(
        'torchvision', reason='torchvision is in the torch 2.1.2 stack')
    from mmengine.runner.checkpoint import get_torchvision_models
    url = get_torchvision_models()['resnet50']
    assert url.startswith('https://') and 'resnet50' in url
