"""The CIFAR-layout backbones: layout, official parameter counts, options,
bad input, and registration in mmpretrain where the extra is installed."""
import subprocess
import sys

import pytest
import torch
import torch.nn as nn
from mmdet.models.backbones.resnet import BasicBlock, Bottleneck

from kcla_mm.models import (KCLAResNetCIFAR, LAResNetCIFAR,
                            MRLALightResNetCIFAR, ResNetCIFAR)
from kcla_mm.models.layers import KCLALayer
from kcla_mm.models.layers.cross_layer_block import cross_layer_block
from kcla_mm.registry import register_backbone
from helpers import requires_mmpretrain

ALL = (ResNetCIFAR, KCLAResNetCIFAR, LAResNetCIFAR, MRLALightResNetCIFAR)
# Official CIFAR-100 KCLA-ResNet-56 (github bgx666/KCLA,
# cifar/models/cifar/KCLA.py, Bottleneck): 650,685 trainable parameters,
# 643 of them never used (stage 1 block 0's adaptation conv 512, key conv
# 3, BN 128), and a 256 -> 100 fc head.
OFFICIAL_TRAINABLE, OFFICIAL_UNUSED, FC = 650_685, 643, 256 * 100 + 100


def trainable(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def test_kcla_r56_has_the_official_used_parameters():
    model = KCLAResNetCIFAR(depth=56)
    assert trainable(model) == OFFICIAL_TRAINABLE - OFFICIAL_UNUSED - FC


@pytest.mark.parametrize('cls', ALL)
@pytest.mark.parametrize('depth,block,blocks,expansion',
                         [(56, 'Bottleneck', 6, 4), (20, 'BasicBlock', 3, 1),
                          (20, 'Bottleneck', 2, 4)])
def test_layout(cls, depth, block, blocks, expansion):
    model = cls(depth=depth, block=block, out_indices=(0, 1, 2)).eval()
    assert model.conv1.kernel_size == (3, 3) and model.conv1.stride == (1, 1)
    assert model.conv1.out_channels == 16
    assert isinstance(model.maxpool, nn.Identity)
    assert model.res_layers == ['layer1', 'layer2', 'layer3']
    block_cls = Bottleneck if block == 'Bottleneck' else BasicBlock
    if cls is not ResNetCIFAR:
        # Its cross-layer subclass, which calls the block's attention.
        block_cls = cross_layer_block(block_cls)
    for name in model.res_layers:
        layer = getattr(model, name)
        assert len(layer) == blocks
        assert all(type(b) is block_cls for b in layer)
    with torch.no_grad():
        outs = model(torch.rand(2, 3, 32, 32))
    assert [tuple(o.shape) for o in outs] == [(2, 16 * expansion, 32, 32),
                                              (2, 32 * expansion, 16, 16),
                                              (2, 64 * expansion, 8, 8)]


def test_kcla_state_is_renormalised_where_the_official_model_does():
    """The first block of stages 2 and 3 adapts the incoming state (a 1x1
    conv grouped by heads of 16, stride 2); the network's first block has
    no state, so nothing is built for it; no other block re-normalises."""
    model = KCLAResNetCIFAR(depth=56)
    for stage, name in enumerate(model.res_layers):
        for j, block in enumerate(getattr(model, name)):
            kcla = block.kcla
            assert isinstance(kcla, KCLALayer) and kcla.head_dim == 16
            assert kcla.renorm == (j == 0 and stage > 0), (name, j)
            if kcla.renorm:
                adapt = kcla.state_adapt
                width = 64 * 2**stage
                assert (adapt.in_channels, adapt.out_channels) == (width // 2,
                                                                   width)
                assert adapt.stride == (2, 2)
                assert adapt.groups == width // 16


@pytest.mark.parametrize('cls', ALL)
def test_frozen_stages_and_norm_eval(cls):
    model = cls(depth=11, frozen_stages=1, norm_eval=True)
    model.train()
    frozen = [model.conv1, model.bn1, model.layer1]
    assert all(not p.requires_grad for m in frozen for p in m.parameters())
    assert all(p.requires_grad for p in model.layer2.parameters())
    assert not any(m.training
                   for m in model.modules() if isinstance(m, nn.BatchNorm2d))


def test_classifier_default_trains_bn_statistics():
    model = KCLAResNetCIFAR(depth=11).train()
    assert all(m.training for m in model.modules()
               if isinstance(m, nn.BatchNorm2d))


@pytest.mark.parametrize('kwargs,field',
                         [(dict(depth=57), 'depth=57'),
                          (dict(depth=20, block='Basic'), 'block'),
                          (dict(depth=22, block='BasicBlock'), 'depth=22'),
                          (dict(depth=2), 'depth=2'),
                          (dict(deep_stem=True), 'deep_stem'),
                          (dict(num_stages=4), 'num_stages'),
                          (dict(strides=(1, 2)), 'strides')])
def test_bad_arguments_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        KCLAResNetCIFAR(**kwargs)


def test_register_backbone_rejects_an_unknown_codebase():
    with pytest.raises(ValueError, match="registries: unknown codebase"):
        register_backbone(registries=('mmdetection', ))


def test_an_unimportable_mmpretrain_warns_and_kcla_mm_still_imports(tmp_path):
    """An installed mmpretrain that cannot be imported (e.g. a torchvision
    for another torch) must not break detection and segmentation users:
    kcla_mm imports, says why the mmpretrain registration is missing."""
    broken = tmp_path / 'mmpretrain'
    broken.mkdir()
    (broken / '__init__.py'
     ).write_text("raise ImportError('torchvision::nms does not exist')\n")
    code = ('import warnings; warnings.simplefilter("always")\n'
            'import kcla_mm\n'
            'from mmdet.registry import MODELS\n'
            'print(MODELS.get("KCLAResNetCIFAR").__name__)\n')
    result = subprocess.run([sys.executable, '-c', code],
                            capture_output=True,
                            text=True,
                            env={
                                'PYTHONPATH': str(tmp_path),
                                'PATH': '/usr/bin:/bin'
                            })
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[-1] == 'KCLAResNetCIFAR'
    assert ('mmpretrain is installed but cannot be imported' in result.stderr
            and 'torchvision::nms does not exist' in result.stderr)


@requires_mmpretrain
@pytest.mark.parametrize('name', [
    'KCLAResNet', 'LAResNet', 'MRLALightResNet', 'MRLALResNet',
    'KCLAResNetCIFAR', 'ResNetCIFAR', 'LAResNetCIFAR', 'MRLALightResNetCIFAR'
])
def test_mmpretrain_classifier_with_each_backbone(name):
    from mmengine.registry import init_default_scope
    from mmpretrain.registry import MODELS
    init_default_scope('mmpretrain')
    cifar = name.endswith('CIFAR')
    backbone = dict(type=name, depth=11 if cifar else 18, head_dim=16)
    if name == 'ResNetCIFAR':
        backbone.pop('head_dim')
    if not cifar:
        backbone.update(out_indices=(3, ), base_channels=16, norm_eval=False)
    model = MODELS.build(
        dict(
            type='ImageClassifier',
            backbone=backbone,
            neck=dict(type='GlobalAveragePooling'),
            head=dict(
                type='LinearClsHead',
                num_classes=7,
                in_channels=256 if cifar else 128,
                loss=dict(type='CrossEntropyLoss'))))
    assert type(model.backbone).__name__ == name.replace(
        'MRLALResNet', 'MRLALightResNet')
    model.eval()
    with torch.no_grad():
        logits = model(torch.rand(2, 3, 32, 32), mode='tensor')
    assert logits.shape == (2, 7) and torch.isfinite(logits).all()
