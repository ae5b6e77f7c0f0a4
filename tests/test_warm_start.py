"""zero_init_attention: starting the layer-attention backbones from plain
ResNet weights (torchvision keys), as people will while no KCLA ImageNet
checkpoint is published."""
import os.path as osp

import pytest
import torch
from mmdet.models.backbones import ResNet

from kcla_mm.models import (KCLAResNet, KCLAResNetCIFAR, LAResNet,
                            MRLALightResNet)
from kcla_mm.models.layers import KCLALayer
from helpers import ROOT, incoming_state
from official_reference import randomise_

BACKBONES = (KCLAResNet, LAResNet, MRLALightResNet)


def plain_resnet_file(path, depth, **kwargs):
    """A torchvision-layout ResNet checkpoint (mmdet's ResNet keys are
    torchvision's, plus the fc head) with random weights and BN statistics,
    so that equal outputs cannot come from an identity init."""
    resnet = randomise_(ResNet(depth=depth, **kwargs))
    state = dict(resnet.state_dict())
    width = resnet.feat_dim
    state['fc.weight'] = torch.randn(1000, width)
    state['fc.bias'] = torch.randn(1000)
    torch.save(state, path)
    return str(path)


def loaded(cls, path, depth, **kwargs):
    model = cls(
        depth=depth,
        init_cfg=dict(type='Pretrained', checkpoint=path),
        **kwargs)
    model.init_weights()
    return model


@pytest.mark.parametrize('cls', BACKBONES)
@pytest.mark.parametrize('depth', [18, 50])
@pytest.mark.parametrize('mode', ['eval', 'train'])
def test_starts_as_the_plain_resnet_it_was_loaded_from(cls, depth, mode,
                                                       tmp_path):
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
    model.train(mode == 'train')
    plain.train(mode == 'train')
    x = torch.rand(2, 3, 64, 64)
    with torch.no_grad():
        got, want = model(x), plain(x)
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    scales = [
        p for n, p in model.named_parameters() if n.endswith('branch_scale')
    ]
    assert len(scales) == sum(model.stage_blocks)
    assert all(not s.any() for s in scales)


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
    scales = [
        p for n, p in model.named_parameters() if n.endswith('branch_scale')
    ]
    assert all(s.abs().sum() > 0 for s in scales)
    # And what is before the scale trains too: once the scale is no
    # longer zero, gradients reach the branch.
    assert not torch.equal(norm.weight, norm_weight_before)
    model.eval()
    plain.eval()
    with torch.no_grad():
        assert not torch.equal(model(x)[-1], plain(x)[-1])


def test_a_zero_norm_weight_would_leave_the_branch_dead():
    """Why zero_init_attention adds a scale instead of zeroing the branch's
    output norm: with the norm's weight and bias at 0 the ReLU that follows
    sees exactly 0, where its gradient is 0, so nothing in the branch (the
    norm included) ever receives a gradient."""
    layer = randomise_(
        KCLALayer(256, renorm=True, state_channels=128, state_stride=2))
    torch.nn.init.zeros_(layer.norm.weight)
    torch.nn.init.zeros_(layer.norm.bias)
    layer.train()
    x = torch.rand(3, 256, 9, 7, requires_grad=True)
    y, _ = layer(x, incoming_state('adapt', 3))
    (y * torch.randn_like(y)).sum().backward()
    grads = {n: p.grad for n, p in layer.named_parameters()}
    assert all(g is None or not g.any() for g in grads.values()), {
        n: None if g is None else g.abs().max()
        for n, g in grads.items()
    }
    # With the scale instead, the scale gets the branch as its gradient.
    layer = randomise_(
        KCLALayer(
            256,
            renorm=True,
            state_channels=128,
            state_stride=2,
            zero_init_branch=True))
    torch.nn.init.zeros_(layer.branch_scale)
    y, _ = layer(x, incoming_state('adapt', 3))
    (y * torch.randn_like(y)).sum().backward()
    assert layer.branch_scale.grad.abs().sum() > 0


@pytest.mark.parametrize('cls', BACKBONES + (KCLAResNetCIFAR, ))
def test_off_by_default_with_no_extra_parameter(cls):
    kwargs = {} if cls is KCLAResNetCIFAR else dict(
        base_channels=16, head_dim=16)
    default = cls(depth=20 if cls is KCLAResNetCIFAR else 18, **kwargs)
    assert not [k for k in default.state_dict() if 'branch_scale' in k]
    warm = cls(
        depth=20 if cls is KCLAResNetCIFAR else 18,
        zero_init_attention=True,
        **kwargs)
    extra = set(warm.state_dict()) - set(default.state_dict())
    assert extra and all(k.endswith('.branch_scale') for k in extra)


def test_warm_start_detection_config():
    from mmdet.registry import MODELS
    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    cfg = Config.fromfile(
        osp.join(ROOT,
                 'configs/kcla/faster-rcnn_kcla-r50-warmstart_fpn_1x_coco.py'))
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
    for key in ('neck', 'rpn_head', 'roi_head', 'train_cfg', 'test_cfg'):
        assert cfg.model[key] == mmdet_cfg.model[key], key
    assert [{
        k: v
        for k, v in s.items() if k != '_scope_'
    } for s in cfg.param_scheduler] == mmdet_cfg.param_scheduler
    init_default_scope('mmdet')
    cfg.model.backbone.init_cfg = None
    model = MODELS.build(cfg.model)
    assert model.backbone.layer1[0].kcla.branch_scale is not None
