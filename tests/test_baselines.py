"""LA and MRLA-light baselines: registries, equations, cost growth, configs;
and the behaviour the three layer-attention backbones share."""
import glob
import math
import os.path as osp
import re

import pytest
import torch
import torch.nn.functional as F
from mmdet.models.backbones import ResNet
from mmdet.registry import MODELS as MMDET_MODELS
from mmengine.config import Config
from mmengine.registry import init_default_scope
from mmseg.registry import MODELS as MMSEG_MODELS

from kcla_mm.analysis.complexity import count_flops, inference_state_bytes
from kcla_mm.models import (KCLAResNet, LAResNet, LAResNetUNetPaper,
                            MRLALightResNet, MRLALightResNetUNetPaper)
from kcla_mm.models.backbones import MMSegLAResNet, MMSegMRLALightResNet
from kcla_mm.models.layers import LALayer, MRLALightLayer
from helpers import ROOT, assert_close_to_max
from helpers import small_backbone as small

BASELINES = {
    'LAResNet': (LAResNet, 'la'),
    'MRLALightResNet': (MRLALightResNet, 'mrla_light')
}
# The same names in mmseg's registry: the classes over mmseg's ResNet.
MMSEG_BASELINES = {
    'LAResNet': MMSegLAResNet,
    'MRLALightResNet': MMSegMRLALightResNet
}


@pytest.mark.parametrize(
    'registry, depth', [(MMDET_MODELS, 18), (MMSEG_MODELS, 18),
                        (MMDET_MODELS, 50)],
    ids=['mmdet-18', 'mmseg-18', 'mmdet-50'])
@pytest.mark.parametrize('name', list(BASELINES))
def test_builds_from_both_registries_and_trains(registry, name, depth):
    cls, attr = BASELINES[name]
    model = registry.build(
        dict(
            type=name,
            depth=depth,
            base_channels=16,
            head_dim=8,
            norm_eval=False))
    assert type(model) is (cls if registry is MMDET_MODELS else
                           MMSEG_BASELINES[name])
    plain = ResNet(depth=depth, base_channels=16)
    # Plain ResNet keys unchanged; everything else is the attention's.
    extra = set(model.state_dict()) - set(plain.state_dict())
    assert set(plain.state_dict()) <= set(model.state_dict())
    assert extra and all(f'.{attr}.' in k for k in extra)
    model.init_weights()
    model.train()
    x = torch.rand(2, 3, 48, 48)
    outs = model(x)
    plain.eval()
    with torch.no_grad():
        assert [o.shape for o in outs] == [o.shape for o in plain(x)]
    sum(o.mean() for o in outs).backward()
    # No never-used parameters (DDP without find_unused_parameters).
    assert [n for n, p in model.named_parameters() if p.grad is None] == []
    assert model.eval() is model
    with torch.no_grad():
        assert all(torch.isfinite(o).all() for o in model(x))


def test_la_layer_is_softmax_layer_attention_over_all_blocks():
    """A stage of three LA layers against the definition, written
    independently: softmax over <Q_t, K_i> / sqrt(d) per head, i <= t."""
    torch.manual_seed(0)
    c, d = 16, 4
    layers = [
        LALayer(c, head_dim=d, drop_path=0.).double().eval() for _ in range(3)
    ]
    for layer in layers:
        layer.init_weights()
        torch.nn.init.normal_(layer.norm.running_mean)
    xs = [torch.randn(2, c, 5, 7, dtype=torch.float64) for _ in range(3)]
    state, keys, values = None, [], []
    for layer, x in zip(layers, xs):
        got, state = layer(x.clone(), state)
        pooled = x.mean((2, 3))[:, None]
        query = layer.query_conv(pooled)[:, 0].view(2, c // d, d)
        keys.append(layer.key_conv(pooled)[:, 0].view(2, c // d, d))
        values.append(x.view(2, c // d, d, 5, 7))
        logits = torch.stack([(query * k).sum(2) for k in keys], 2)
        attn = torch.softmax(logits / math.sqrt(d), dim=2)
        agg = sum(attn[:, :, i, None, None, None] * v
                  for i, v in enumerate(values)).reshape(2, c, 5, 7)
        want = x + F.relu(layer.norm(layer.value_conv(agg)))
        torch.testing.assert_close(got, want)
    assert len(state.values) == 3 and state.keys.shape == (2, 3, c)


def test_mrla_light_layer_follows_its_recurrence():
    """O^t = sigmoid(<Q,K>/sqrt(d)) V^t + lambda^t O^{t-1}, written
    independently, over two layers."""
    torch.manual_seed(0)
    c, d = 16, 4
    first = MRLALightLayer(
        c, head_dim=d, receives_state=False, drop_path=0.).double().eval()
    second = MRLALightLayer(c, head_dim=d, drop_path=0.).double().eval()
    assert first.decay is None and second.decay.shape == (c, )
    prev = None
    for layer in (first, second):
        layer.init_weights()
        x = torch.randn(2, c, 6, 6, dtype=torch.float64)
        got, o = layer(x.clone(), prev)
        pooled = x.mean((2, 3))[:, None]
        q = layer.query_conv(pooled).view(2, c // d, d)
        k = layer.key_conv(pooled).view(2, c // d, d)
        gate = torch.sigmoid((q * k).sum(2) / math.sqrt(d))
        want_o = gate.repeat_interleave(d, 1)[..., None, None] * \
            layer.value_conv(x)
        if prev is not None:
            want_o = want_o + layer.decay.view(1, c, 1, 1) * prev
        torch.testing.assert_close(o, want_o)
        torch.testing.assert_close(got, x + layer.norm(want_o))
        prev = o


@pytest.mark.parametrize('cls', [KCLAResNet, LAResNet, MRLALightResNet])
def test_with_cp_gives_the_same_gradients(cls, float64):
    """In float64: without with_cp, KCLA's compiled train step fuses each
    block's add and ReLU with the layer's plane means (train_tail.py),
    which sums them in another order than the checkpointed block."""
    torch.manual_seed(0)
    plain = small(cls, norm_eval=False)
    plain.init_weights()
    cp = small(cls, norm_eval=False, with_cp=True)
    cp.load_state_dict(plain.state_dict())
    x = torch.rand(2, 3, 32, 32)
    grads = []
    for model in (plain, cp):
        model.train()
        torch.manual_seed(1)  # same drop-path masks
        sum((o * o).mean() for o in model(x)).backward()
        grads.append({n: p.grad for n, p in model.named_parameters()})
    for n, g in grads[0].items():
        assert_close_to_max(grads[1][n], g, 1e-10)


@pytest.mark.parametrize('name', list(BASELINES))
def test_frozen_stages_freeze_the_attention_of_frozen_stages(name):
    cls, attr = BASELINES[name]
    model = small(cls, frozen_stages=1)
    assert not any(p.requires_grad for p in model.layer1.parameters())
    assert all(
        p.requires_grad for p in getattr(model.layer2[0], attr).parameters())


def test_la_cost_grows_faster_with_depth_than_kcla():
    """FLOP overheads over the plain ResNet at two depths, and the state
    carried at inference: LA's cache grows, KCLA's state does not."""
    x = torch.rand(1, 3, 32, 32)
    overhead, state = {}, {}
    for depth in (18, 34):
        base = count_flops(ResNet(depth=depth, base_channels=8), x)
        for cls in (KCLAResNet, LAResNet):
            model = cls(depth=depth, base_channels=8, head_dim=8)
            overhead[cls, depth] = count_flops(model, x) - base
            state[cls, depth] = inference_state_bytes(model, x)
    # 18 -> 34: 8 -> 16 blocks.
    kcla_growth = overhead[KCLAResNet, 34] / overhead[KCLAResNet, 18]
    la_growth = overhead[LAResNet, 34] / overhead[LAResNet, 18]
    assert overhead[KCLAResNet, 18] > 0
    assert la_growth > kcla_growth * 1.1
    # LA's weighted sum reads t cached blocks at block t: its overhead per
    # block grows with depth; KCLA reads one state.
    assert overhead[LAResNet, 34] / 16 > overhead[LAResNet, 18] / 8
    assert overhead[KCLAResNet, 34] / 16 <= overhead[KCLAResNet, 18] / 8
    assert state[KCLAResNet, 34] == state[KCLAResNet, 18] > 0
    assert state[LAResNet, 34] > 1.5 * state[LAResNet, 18]


@pytest.mark.parametrize('kwargs, message', [
    (dict(depth=42), 'depth=42'),
    (dict(depth=18, head_dim=48), 'head_dim=48'),
    (dict(depth=50, strides=(1, 2, 2)), r'strides=\(1, 2, 2\)'),
])
@pytest.mark.parametrize('name', list(BASELINES))
def test_bad_arguments_name_the_field(name, kwargs, message):
    with pytest.raises(ValueError, match=message):
        BASELINES[name][0](**kwargs)


@pytest.mark.parametrize('cls, field',
                         [(LAResNet, 'la_drop_path'),
                          (MRLALightResNet, 'mrla_light_drop_path')])
def test_bad_drop_path_is_named(cls, field):
    with pytest.raises(ValueError, match=f'{field}=1.5'):
        cls(depth=18, **{field: 1.5})


@pytest.mark.parametrize('cls', [KCLAResNet, LAResNet, MRLALightResNet])
def test_wrong_input_channels_are_named(cls):
    model = small(cls).eval()
    with pytest.raises(
            ValueError, match=f'{cls.__name__} expects.*in_channels=3'):
        model(torch.rand(1, 4, 32, 32))


# The layer-attention baselines (the plain-ResNet classifiers beside them
# are tested in test_classification.py).
BASELINE_CONFIGS = sorted(
    p for p in glob.glob(osp.join(ROOT, 'configs', 'baselines', '*.py'))
    if re.search(r'_(la|mrla-light)-r', osp.basename(p)))


def test_every_comparison_config_exists():
    names = {osp.basename(p) for p in BASELINE_CONFIGS}
    for method in ('la', 'mrla-light'):
        for det in ('faster', 'mask'):
            assert f'{det}-rcnn_{method}-r50_fpn_1x_coco.py' in names
        for data in ('isic2017', 'isic2018', 'kvasir-seg'):
            assert f'unet_{method}-r18_{data}-256x256.py' in names


@pytest.mark.parametrize('path', BASELINE_CONFIGS, ids=osp.basename)
def test_config_builds_its_model(path):
    cfg = Config.fromfile(path)
    name = osp.basename(path)
    want = 'LAResNet' if '_la-' in name else 'MRLALightResNet'
    paper = name.startswith('unet-paper_')  # the paper's own UNet layout
    if paper:
        want += 'UNetPaper'
    assert cfg.model.backbone.type == want
    scope = cfg.get('default_scope', 'mmdet')
    init_default_scope(scope)
    registry = MMSEG_MODELS if scope == 'mmseg' else MMDET_MODELS
    model = registry.build(cfg.model)
    if paper:
        expected = (
            LAResNetUNetPaper if '_la-' in name else MRLALightResNetUNetPaper)
    else:
        expected = (
            MMSEG_BASELINES[want] if scope == 'mmseg' else BASELINES[want][0])
    assert type(model.backbone) is expected
    if paper:
        # The official encoder: stages of 32 / 64 / 128 / 128 planes.
        assert list(model.backbone.stage_planes) == [32, 64, 128, 128]
        return
    if name.startswith(('faster', 'mask')):
        # The ResNet part starts from plain ImageNet ResNet-50 weights.
        assert cfg.model.backbone.depth == 50
        assert cfg.model.backbone.init_cfg.type == 'Pretrained'
    else:
        assert cfg.model.backbone.base_channels == 32
