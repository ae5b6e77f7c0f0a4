"""Every backbone option is checked when the backbone is built, and a bad
value is refused with an error that names the config key as the user wrote
it (``kcla_drop_path``, not the layer's ``drop_path``): for the three layer
families in mmdet's and mmseg's registries, and the CIFAR layouts.

Where mmdet's / mmseg's own ResNet raises for the same value, ours is also
an instance of what it raises (checked against them here); where upstream
takes the value silently (a negative ``out_indices``, ``frozen_stages=-2``,
a stride of 0), ours refuses it, as a ValueError.
"""
import math
import re
from dataclasses import dataclass

import pytest
import torch
from mmdet.models.backbones import ResNet as MMDetResNet
from mmdet.registry import MODELS as MMDET_MODELS
from mmseg.models.backbones import ResNet as MMSegResNet
from mmseg.registry import MODELS as MMSEG_MODELS

import kcla_mm  # noqa: F401  (registers the backbones)
from kcla_mm.models.backbones.cross_layer_resnet import CrossLayerResNetMixin

REGISTRY = {'mmdet': MMDET_MODELS, 'mmseg': MMSEG_MODELS}
UPSTREAM = {'mmdet': MMDetResNet, 'mmseg': MMSegResNet}
FAMILIES = ('KCLA', 'LA', 'MRLALight')


@dataclass(frozen=True)
class Backbone:
    """One backbone type, as a config names it in one registry."""
    registry: str
    family: str  # KCLA, LA, MRLALight, or '' (the plain CIFAR ResNet)
    cifar: bool = False

    def __str__(self) -> str:
        return f'{self.registry}-{self.type}'

    @property
    def type(self) -> str:
        return self.family + ('ResNetCIFAR' if self.cifar else 'ResNet')

    @property
    def num_stages(self) -> int:
        return 3 if self.cifar else 4

    @property
    def base_kwargs(self) -> dict:
        kwargs = dict(
            depth=8, block='BasicBlock') if self.cifar else dict(
                depth=18, base_channels=16)
        if self.family:
            kwargs['head_dim'] = 16
        return kwargs

    def build(self, **kwargs):
        cfg = dict(type=self.type, **dict(self.base_kwargs, **kwargs))
        return REGISTRY[self.registry].build(cfg)


ATTENTION = [
    Backbone(r, f, cifar) for r in REGISTRY for f in FAMILIES
    for cifar in (False, True)
]
BACKBONES = ATTENTION + [Backbone(r, '', True) for r in REGISTRY]


def by_family(family):
    return [b for b in ATTENTION if b.family == family]


def refused(backbone: Backbone, key: str, value) -> BaseException:
    """The error of building ``backbone`` with ``key=value``, after
    checking that it names ``key`` (not a longer or shorter key)."""
    with pytest.raises(
            ValueError, match=rf'(?<![\w.]){re.escape(key)}=') as info:
        backbone.build(**{key: value})
    return info.value


# (key, value) of the options of mmdet's / mmseg's ResNet; a callable value
# is called with the backbone's num_stages.
NAN, INF = float('nan'), float('inf')
RESNET_CASES = [
    ('frozen_stages', 9),
    ('frozen_stages', lambda n: n + 1),
    ('frozen_stages', -2),
    ('frozen_stages', 1.5),
    ('frozen_stages', '1'),
    ('out_indices', (-1, )),
    ('out_indices', ()),
    ('out_indices', lambda n: (n, )),
    ('out_indices', (2, 0)),
    ('out_indices', (1, 1)),
    ('out_indices', 2),
    ('out_indices', ('1', )),
    ('num_stages', '3'),
    ('strides', lambda n: (1, ) * (n - 1) + (0, )),
    ('strides', 2),
    ('dilations', lambda n: (1, ) * (n - 1) + (-2, )),
    ('style', 'tensorflow'),
    ('norm_eval', 'False'),
    ('with_cp', 'yes'),
    ('zero_init_residual', None),
    ('avg_down', 'no'),
    ('in_channels', 0),
    ('base_channels', 0),
    ('stem_channels', 'wide'),
    ('norm_cfg', 'BN'),
    ('norm_cfg', dict(requires_grad=True)),
    ('norm_cfg', dict(type='NoSuchNorm')),
    ('norm_cfg', dict(type='GN')),
    ('norm_cfg', dict(type='GN', num_groups=7)),
    ('conv_cfg', 'Conv2d'),
    ('conv_cfg', dict(type='NoSuchConv')),
]


def case_id(case):
    key, value = case
    return f'{key}={value.__name__ if callable(value) else value!r}'


def resolve(value, backbone: Backbone):
    return value(backbone.num_stages) if callable(value) else value


@pytest.mark.parametrize('case', RESNET_CASES, ids=case_id)
@pytest.mark.parametrize('backbone', BACKBONES, ids=str)
def test_resnet_options_are_refused_by_name(backbone, case):
    key, value = case
    refused(backbone, key, resolve(value, backbone))


def test_the_issue_cases_say_what_is_valid():
    backbone = Backbone('mmdet', 'KCLA')
    assert '-1..num_stages=4' in str(refused(backbone, 'frozen_stages', 9))
    assert 'negative indices are not supported' in str(
        refused(backbone, 'out_indices', (-1, )))
    assert 'at least one stage in 0..3' in str(
        refused(backbone, 'out_indices', ()))
    assert 'positive finite' in str(
        refused(backbone, 'temperature_range', [0, 1]))
    assert str(refused(backbone, 'kcla_drop_path',
                       -0.1)).startswith('kcla_drop_path=-0.1')


@pytest.mark.parametrize('case', RESNET_CASES, ids=case_id)
@pytest.mark.parametrize(
    'backbone', [b for b in ATTENTION if not b.cifar], ids=str)
def test_refusals_are_of_the_type_upstream_raises(backbone, case):
    """Where mmdet's / mmseg's ResNet raises for the same value (e.g.
    AttributeError for frozen_stages=9, KeyError for an unknown norm
    type), ours is an instance of that type too."""
    key, value = case
    value = resolve(value, backbone)
    kwargs = dict(backbone.base_kwargs, **{key: value})
    del kwargs['head_dim']
    try:
        UPSTREAM[backbone.registry](**kwargs)
    except Exception as error:
        upstream_error = error
    else:
        upstream_error = None
    ours = refused(backbone, key, value)
    if upstream_error is not None:
        assert isinstance(ours, type(upstream_error)), (ours, upstream_error)


ATTENTION_CASES = [
    ('head_dim', 0),
    ('head_dim', -16),
    ('head_dim', 24),
    ('head_dim', 16.0),
    ('head_dim', '16'),
    ('zero_init_attention', 'False'),
]


@pytest.mark.parametrize('case', ATTENTION_CASES, ids=case_id)
@pytest.mark.parametrize('backbone', ATTENTION, ids=str)
def test_attention_options_are_refused_by_name(backbone, case):
    refused(backbone, *case)


KCLA_CASES = [
    ('temperature_range', [0, 1]),
    ('temperature_range', (-0.7, 1.4)),
    ('temperature_range', (0.7, INF)),
    ('temperature_range', (NAN, 1.4)),
    ('temperature_range', (1 / 0.7, 0.7)),
    ('temperature_range', (0.7, )),
    ('temperature_range', (0.7, 1.0, 1.4)),
    ('temperature_range', 0.7),
    ('temperature_range', '0.7'),
    ('temperature_range', (1e-50, 1.0)),  # 0 in fp32
    ('temperature_range', (0.7, 1e39)),  # inf in fp32
    ('clamp', NAN),
    ('clamp', INF),
    ('clamp', 0),
    ('clamp', -1.),
    ('clamp', 100.),
    ('clamp', '10'),
    ('kcla_drop_path', -0.1),
    ('kcla_drop_path', 1.),
    ('kcla_drop_path', NAN),
    ('kcla_drop_path', '0.1'),
    ('renorm_blocks', (11, )),
    ('renorm_blocks', ()),
    ('renorm_blocks', (-1, 0)),
    ('renorm_blocks', (0.5, 0)),
    ('renorm_blocks', 0),
    ('kcla_implementation', 'fast'),
]


@pytest.mark.parametrize('case', KCLA_CASES, ids=case_id)
@pytest.mark.parametrize('backbone', by_family('KCLA'), ids=str)
def test_kcla_options_are_refused_by_name(backbone, case):
    refused(backbone, *case)


DROP_PATHS = [-0.1, 1., 1.5, NAN, INF, '0.1', None]


@pytest.mark.parametrize('value', DROP_PATHS, ids=repr)
@pytest.mark.parametrize('backbone', by_family('LA'), ids=str)
def test_la_drop_path_is_refused_by_name(backbone, value):
    refused(backbone, 'la_drop_path', value)


@pytest.mark.parametrize('value', DROP_PATHS, ids=repr)
@pytest.mark.parametrize('backbone', by_family('MRLALight'), ids=str)
def test_mrla_light_drop_path_is_refused_by_name(backbone, value):
    refused(backbone, 'mrla_light_drop_path', value)


MMSEG_CASES = [
    ('multi_grid', (1, )),  # ResNet-18's last stage has 2 blocks
    ('multi_grid', (1, 2, 4)),
    ('multi_grid', (1, 0)),
    ('multi_grid', 2),
    ('contract_dilation', 'yes'),
]


@pytest.mark.parametrize('case', MMSEG_CASES, ids=case_id)
@pytest.mark.parametrize(
    'backbone',
    [b for b in ATTENTION if b.registry == 'mmseg' and not b.cifar],
    ids=str)
def test_mmseg_options_are_refused_by_name(backbone, case):
    ours = refused(backbone, *case)
    if case == ('multi_grid', (1, )):
        # mmseg's ResNet indexes it per block.
        with pytest.raises(IndexError):
            MMSegResNet(depth=18, base_channels=16, multi_grid=(1, ))
        assert isinstance(ours, IndexError)


def test_layer_keeps_its_own_key_for_direct_users():
    from kcla_mm.models.layers import KCLALayer, LALayer, MRLALightLayer
    for layer in (KCLALayer, LALayer, MRLALightLayer):
        with pytest.raises(ValueError, match=r'^drop_path=-0\.1 '):
            layer(64, head_dim=16, drop_path=-0.1)


# Values at the edge of the valid range still build, and do what they say.
@pytest.mark.parametrize('backbone', BACKBONES, ids=str)
def test_edge_values_build(backbone):
    n = backbone.num_stages
    kwargs = dict(
        frozen_stages=n,
        out_indices=(n - 1, ),
        norm_eval=1,
        norm_cfg=dict(type='GN', num_groups=4, requires_grad=True))
    if backbone.family == 'KCLA':
        kwargs.update(
            temperature_range=(1., 1.),
            clamp=0.5,
            kcla_drop_path=0.,
            renorm_blocks=(0, ))
    elif backbone.family:
        kwargs[f'{backbone.family.lower().replace("light", "_light")}'
               '_drop_path'] = 0.999
    if backbone.registry == 'mmseg' and not backbone.cifar:
        kwargs['multi_grid'] = (1, 2)
    model = backbone.build(**kwargs)
    upstream = UPSTREAM[backbone.registry] if not backbone.cifar else (
        MMDetResNet)
    assert isinstance(model, upstream)
    assert isinstance(model, CrossLayerResNetMixin) is bool(backbone.family)
    model.train()
    frozen = getattr(model, f'layer{n}')
    assert all(not p.requires_grad for p in frozen.parameters())
    outs = model(torch.rand(2, 3, 32, 32))
    assert len(outs) == 1
    assert outs[0].shape[1] == model.feat_dim
    assert all(torch.isfinite(o).all() for o in outs)
    # Nothing frozen, the first stage only.
    model = backbone.build(frozen_stages=-1, out_indices=(0, ))
    assert all(p.requires_grad for p in model.parameters())
    assert len(model(torch.rand(2, 3, 32, 32))) == 1


@pytest.mark.parametrize('registry', list(REGISTRY))
def test_a_single_stage_kcla_needs_no_renorm_block(registry):
    model = Backbone(registry, 'KCLA').build(
        num_stages=1,
        strides=(1, ),
        dilations=(1, ),
        out_indices=(0, ),
        renorm_blocks=())
    assert len(model(torch.rand(2, 3, 32, 32))) == 1


def test_clamp_bound_is_where_exp_overflows_fp32():
    from kcla_mm.models.backbones.arguments import MAX_CLAMP
    assert math.isfinite(torch.tensor(MAX_CLAMP - 0.01).exp().item())
    assert math.isinf(torch.tensor(MAX_CLAMP + 0.01).exp().item())
