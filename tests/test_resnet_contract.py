"""The contract of mmdet's and mmseg's ResNet unit tests, checked for the
layer-attention backbones of kcla_mm against the upstream classes.

Upstream, ``tests/test_models/test_backbones/test_resnet.py`` of
open-mmlab/mmdetection (``test_resnet_backbone``, ``test_resnest_stem``) and
of open-mmlab/mmsegmentation (``test_resnet_backbone``) build their ResNet
with one option at a time and check what the option does. This module,
written for kcla_mm, turns those cases into a differential test: each case
builds the upstream class (mmdet's ``ResNet`` / ``ResNetV1d``, mmseg's
``ResNet`` / ``ResNetV1c`` / ``ResNetV1d``) and ours from the library's
registry (mmdet's or mmseg's ``MODELS``, after ``import kcla_mm``; that
proves the registration too) with the same arguments, and asserts the same
outcome: the same exception, the same train/eval and requires_grad state,
the same modules, state-dict keys and output shapes; ours only adds the
attention module after every block.

The upstream cases are kept, small: images of 32x32 (96x96 with deformable
convs, whose compiled CPU op wants every input at least as large as the
kernel) and narrow widths. Two arguments are set apart from the case's:
``head_dim``, ours alone, must divide every stage width (a case without it
gets the largest divisor of the first stage width up to the family's
default); and mmseg's ResNet defaults ``stem_channels`` to 64 where ours
takes ``base_channels`` (kept from the classes ours replace in mmseg's
registry; ``tests/test_mmseg_backbones.py`` checks that rule), so every
mmseg case passes ``stem_channels`` (64 unless the case sets it) to both.

Out of scope: upstream's tests of the building blocks alone
(``test_resnet_basic_block``, ``test_resnet_bottleneck``,
``test_simplied_basic_block``, ``test_resnet_res_layer``). They build no
backbone, and kcla_mm uses those blocks unchanged. The ``ResLayer`` options
that only mmseg has (``contract_dilation``, ``multi_grid``) are checked
here on the whole backbone instead, at output stride 8 and 16.
"""
import math
from dataclasses import dataclass

import pytest
import torch
from mmcv.ops import DeformConv2dPack
from mmdet.models import backbones as mmdet_backbones
from mmdet.models.backbones import resnet as mmdet_resnet
from mmdet.registry import MODELS as MMDET_MODELS
from mmseg.models import backbones as mmseg_backbones
from mmseg.models.backbones import resnet as mmseg_resnet
from mmseg.registry import MODELS as MMSEG_MODELS
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

import kcla_mm  # noqa: F401  (registers the backbones)
from kcla_mm.models.layers import KCLALayer, LALayer, MRLALightLayer

# Registry name: the attribute each block's attention module sits at, the
# family's default head_dim, the attention module's class.
FAMILIES = {
    'KCLAResNet': ('kcla', 64, KCLALayer),
    'LAResNet': ('la', 64, LALayer),
    'MRLALightResNet': ('mrla_light', 32, MRLALightLayer),
}
# The upstream class of each library and variant. mmdet's registry has no
# V1d name for ours: mmdet's ResNetV1d is its ResNet with deep_stem=True and
# avg_down=True, and so is ours.
UPSTREAM = {
    'mmdet': {
        '': mmdet_backbones.ResNet,
        'V1d': mmdet_backbones.ResNetV1d
    },
    'mmseg': {
        '': mmseg_backbones.ResNet,
        'V1c': mmseg_backbones.ResNetV1c,
        'V1d': mmseg_backbones.ResNetV1d
    },
}
REGISTRY = {'mmdet': MMDET_MODELS, 'mmseg': MMSEG_MODELS}
BLOCKS = (mmdet_resnet.BasicBlock, mmdet_resnet.Bottleneck,
          mmseg_resnet.BasicBlock, mmseg_resnet.Bottleneck)
MMSEG_STEM_CHANNELS = 64  # the default of mmseg's ResNet


@dataclass(frozen=True)
class Pair:
    """One of our backbones and the upstream class it must behave like."""
    library: str
    family: str
    variant: str

    def __str__(self) -> str:
        return f'{self.library}-{self.family}{self.variant}'

    @property
    def attention(self) -> str:
        return FAMILIES[self.family][0]

    @property
    def upstream_class(self) -> type:
        return UPSTREAM[self.library][self.variant]

    def _kwargs(self, kwargs: dict) -> dict:
        kwargs = dict(kwargs)
        if self.library == 'mmseg':
            kwargs.setdefault('stem_channels', MMSEG_STEM_CHANNELS)
        return kwargs

    def ours(self, **kwargs) -> nn.Module:
        kwargs = self._kwargs(kwargs)
        _, default_head_dim, _ = FAMILIES[self.family]
        arch = self.upstream_class.arch_settings
        if 'head_dim' not in kwargs and kwargs.get('depth') in arch:
            width = (
                kwargs.get('base_channels', 64) *
                arch[kwargs['depth']][0].expansion)
            kwargs['head_dim'] = math.gcd(default_head_dim, width)
        if self.library == 'mmdet':
            cfg = dict(type=self.family, **kwargs)
            if self.variant == 'V1d':
                cfg.update(deep_stem=True, avg_down=True)
        else:
            cfg = dict(type=self.family + self.variant, **kwargs)
        return REGISTRY[self.library].build(cfg)

    def upstream(self, **kwargs) -> nn.Module:
        return self.upstream_class(**self._kwargs(kwargs))

    def build(self, **kwargs):
        """Ours and the upstream model from the same arguments, after
        checking that ours is the upstream model plus the attention."""
        ours, theirs = self.ours(**kwargs), self.upstream(**kwargs)
        assert isinstance(ours, UPSTREAM[self.library][''])
        assert type(ours).__module__.startswith('kcla_mm.')
        assert_upstream_plus_attention(ours, theirs, self)
        return ours, theirs


MMDET_PAIRS = [Pair('mmdet', f, v) for f in FAMILIES for v in ('', 'V1d')]
MMSEG_PAIRS = [
    Pair('mmseg', f, v) for f in FAMILIES for v in ('', 'V1c', 'V1d')
]
PAIRS = MMDET_PAIRS + MMSEG_PAIRS
PLAIN_PAIRS = [p for p in PAIRS if p.variant == '']


def in_attention(name: str, attention: str) -> bool:
    return attention in name.split('.')


# What identifies a module's configuration, as far as these modules have it.
SIGNATURE = ('in_channels', 'out_channels', 'kernel_size', 'stride', 'padding',
             'dilation', 'groups', 'num_features', 'num_groups',
             'num_channels', 'eps', 'affine', 'with_cp', 'style', 'ratio',
             'num_heads', 'planes', 'inplanes')


def signature(module: nn.Module, like: nn.Module) -> dict:
    """The SIGNATURE attributes of ``module`` that ``like`` has."""
    return {a: getattr(module, a, None) for a in SIGNATURE if hasattr(like, a)}


def assert_same_kind(ours: nn.Module, theirs: nn.Module, name: str) -> None:
    """The same class, or (the backbone, its stages) a kcla_mm subclass."""
    if type(ours) is not type(theirs):
        assert isinstance(ours, type(theirs)), name
        assert type(ours).__module__.startswith('kcla_mm.'), name


def assert_upstream_plus_attention(ours, theirs, pair: Pair) -> None:
    """Every module of the upstream model is in ours, under the same name
    and configured the same; ours adds exactly one attention module per
    block; the state dicts agree on every upstream key and shape, so an
    upstream checkpoint loads with only the attention keys missing."""
    attention = pair.attention
    layer_class = FAMILIES[pair.family][2]
    our_modules = dict(ours.named_modules())
    their_modules = dict(theirs.named_modules())
    extra = set(our_modules) - set(their_modules)
    assert all(in_attention(n, attention) for n in extra), extra
    assert set(their_modules) <= set(our_modules)
    for name, module in their_modules.items():
        if name:  # the backbone itself: Pair.build checks its class
            assert_same_kind(our_modules[name], module, name)
        assert signature(our_modules[name],
                         module) == signature(module, module), name
    blocks = [n for n, m in ours.named_modules() if isinstance(m, BLOCKS)]
    assert blocks
    assert {n
            for n in extra
            if n.count('.') == 2} == {f'{b}.{attention}'
                                      for b in blocks}
    assert all(
        isinstance(our_modules[f'{b}.{attention}'], layer_class)
        for b in blocks)

    ours_sd, theirs_sd = ours.state_dict(), theirs.state_dict()
    plain = {
        k: v
        for k, v in ours_sd.items() if not in_attention(k, attention)
    }
    assert set(plain) == set(theirs_sd)
    assert {
        k: v.shape
        for k, v in plain.items()
    } == {
        k: v.shape
        for k, v in theirs_sd.items()
    }
    missing, unexpected = ours.load_state_dict(theirs_sd, strict=False)
    assert unexpected == []
    # torch fills in a missing num_batches_tracked without reporting it.
    assert set(missing) <= set(ours_sd) - set(theirs_sd)
    assert {
        n
        for n, _ in ours.named_parameters() if in_attention(n, attention)
    } <= set(missing)


def blocks_of(model):
    return [m for m in model.modules() if isinstance(m, BLOCKS)]


def norms_of(model):
    return [
        m for m in model.modules() if isinstance(m, (_BatchNorm, nn.GroupNorm))
    ]


def outputs(model, size: int):
    model.train()
    torch.manual_seed(1)
    # A batch of 2: at 32x32 the last stage is 1x1, and a batch norm in
    # training needs more than one value per channel.
    return model(torch.randn(2, 3, size, size))


def assert_same_outputs(ours, theirs, size: int = 32) -> None:
    ours_out, theirs_out = outputs(ours, size), outputs(theirs, size)
    assert [o.shape for o in ours_out] == [o.shape for o in theirs_out]


# ---------------------------------------------------------------------------
# Bad arguments: the exception type upstream raises; where our own argument
# checks raise first (before the build), a ValueError naming the field.
DCN = dict(type='DCN', deform_groups=1, fallback_on_stride=False)
BAD_ARGUMENTS = {
    'unknown_depth': (dict(depth=20), KeyError, 'depth'),
    'no_stage': (dict(depth=50, num_stages=0), AssertionError, 'num_stages'),
    'five_stages': (dict(depth=50,
                         num_stages=5), AssertionError, 'num_stages'),
    'strides_dilations_length':
    (dict(depth=50, strides=(1, ), dilations=(1, 1),
          num_stages=3), AssertionError, 'strides'),
    'stage_with_dcn_length':
    (dict(depth=50, dcn=DCN, stage_with_dcn=(True, )), AssertionError, None),
    'plugin_stages_length': (dict(
        depth=50,
        plugins=[
            dict(
                cfg=dict(type='ContextBlock', ratio=1. / 16),
                stages=(False, True, True),
                position='after_conv3')
        ]), AssertionError, None),
    'pretrained_not_str': (dict(depth=50, pretrained=0), TypeError, None),
    'style': (dict(depth=50, style='tensorflow'), AssertionError, 'style'),
}


def raised(build, kwargs) -> BaseException:
    with pytest.raises(Exception) as info:
        build(**kwargs)
    return info.value


@pytest.mark.parametrize('case', list(BAD_ARGUMENTS))
@pytest.mark.parametrize('pair', PAIRS, ids=str)
def test_bad_arguments_raise_as_upstream(pair, case):
    kwargs, expected, field = BAD_ARGUMENTS[case]
    theirs = raised(pair.upstream, kwargs)
    ours = raised(pair.ours, kwargs)
    assert type(theirs) is expected
    assert isinstance(ours, expected)
    if field is None:
        # Raised by the upstream code that ours runs.
        assert type(ours) is type(theirs)
    else:
        # Raised by our own check, which names the field.
        assert isinstance(ours, ValueError)
        assert f'{field}=' in str(ours)


# ---------------------------------------------------------------------------
# Train/eval and requires_grad state.
@pytest.mark.parametrize('pretrained', [None, 'torchvision://resnet50'])
@pytest.mark.parametrize('pair', PAIRS, ids=str)
def test_norm_eval(pair, pretrained):
    # A checkpoint name only sets init_cfg; nothing is downloaded here.
    ours, theirs = pair.build(
        depth=50, base_channels=2, norm_eval=True, pretrained=pretrained)
    assert ours.init_cfg == theirs.init_cfg
    for model in (ours, theirs):
        model.train()
        batch_norms = [m for m in model.modules() if isinstance(m, _BatchNorm)]
        assert batch_norms
        assert not any(m.training for m in batch_norms)
    # The attention modules' own norms are among them.
    assert any(
        isinstance(m, _BatchNorm) for n, m in ours.named_modules()
        if in_attention(n, pair.attention))


@pytest.mark.parametrize('pair', PAIRS, ids=str)
def test_frozen_stages(pair):
    # norm_eval=False: mmdet's default (True) puts every batch norm in eval
    # mode and would hide what frozen_stages does (test_norm_eval checks it).
    ours, theirs = pair.build(
        depth=50, base_channels=2, frozen_stages=1, norm_eval=False)
    if pair.variant:
        assert len(ours.stem) == len(theirs.stem) == 9
    attention = pair.attention
    state = {}
    for key, model in (('ours', ours), ('theirs', theirs)):
        model.train()
        state[key] = ({
            n
            for n, p in model.named_parameters() if not p.requires_grad
        }, {n
            for n, m in model.named_modules() if not m.training})
    (frozen, evaluated), (their_frozen, their_evaluated) = (state['ours'],
                                                            state['theirs'])
    assert any(n.startswith('layer1.') for n in their_frozen)
    stems = ['stem.'] if pair.variant else ['conv1.', theirs.norm1_name]
    for stem in stems:
        assert any(n.startswith(stem) for n in their_frozen)
    assert {n
            for n in frozen if not in_attention(n, attention)} == their_frozen
    assert {n
            for n in evaluated
            if not in_attention(n, attention)} == their_evaluated

    # The attention of a frozen stage is frozen, that of the next trains.
    def attention_in(layer, named):
        return {
            n
            for n, _ in named()
            if n.startswith(f'{layer}.') and in_attention(n, attention)
        }

    for layer, is_frozen in (('layer1', True), ('layer2', False)):
        params = attention_in(layer, ours.named_parameters)
        modules = attention_in(layer, ours.named_modules)
        assert params and modules
        assert (params <= frozen) is is_frozen
        assert (params.isdisjoint(frozen)) is not is_frozen
        assert (modules <= evaluated) is is_frozen
        assert (modules.isdisjoint(evaluated)) is not is_frozen
    assert {n
            for n in frozen if in_attention(n, attention)
            } == attention_in('layer1', ours.named_parameters)


# ---------------------------------------------------------------------------
# Options that change the model: the same modules (checked in Pair.build),
# the case's own property in both, and the same output shapes.
def every_block_with_cp(model):
    assert blocks_of(model) and all(b.with_cp for b in blocks_of(model))


def every_norm_is(norm_class):

    def check(model):
        assert norms_of(model)
        assert all(isinstance(m, norm_class) for m in norms_of(model))

    return check


def residual_norms_zero(model):
    model.init_weights()
    for block in blocks_of(model):
        norm = block.norm3 if hasattr(block, 'norm3') else block.norm2
        assert all(not p.any() for p in norm.parameters())


def deform_conv_in(stages):

    def check(model):
        for i, with_dcn in enumerate(stages):
            for block in getattr(model, f'layer{i + 1}'):
                assert isinstance(block.conv2, DeformConv2dPack) is with_dcn

    return check


def plugins_per_stage(*stages):

    def check(model):
        for i, expected in enumerate(stages):
            for block in getattr(model, f'layer{i + 1}'):
                names = (
                    block.after_conv1_plugin_names +
                    block.after_conv2_plugin_names +
                    block.after_conv3_plugin_names)
                assert set(names) == set(expected)

    return check


def stem_width(stem_channels):

    def check(model):
        assert model.stem_channels == stem_channels
        assert model.layer1[0].conv1.in_channels == stem_channels
        if model.deep_stem:
            assert model.stem[6].out_channels == stem_channels
            assert model.stem[0].out_channels == stem_channels // 2
        else:
            assert model.conv1.out_channels == stem_channels
            assert model.norm1.num_features == stem_channels

    return check


def no_check(model):
    pass


GEN_ATTENTION = dict(
    type='GeneralizedAttention',
    spatial_range=-1,
    num_heads=8,
    attention_type='0010',
    kv_stride=2)
# id: (arguments, image size, check run on both models).
OPTIONS = {
    'r18': (dict(depth=18), 32, no_check),
    'r50_batch_norm': (dict(depth=50,
                            base_channels=1), 32, every_norm_is(_BatchNorm)),
    'out_indices': (dict(depth=50, base_channels=1,
                         out_indices=(0, 1, 2)), 32, no_check),
    'r18_with_cp': (dict(depth=18, with_cp=True), 32, every_block_with_cp),
    'r50_with_cp': (dict(depth=50, base_channels=1,
                         with_cp=True), 32, every_block_with_cp),
    'group_norm': (dict(
        depth=50,
        base_channels=4,
        norm_cfg=dict(type='GN', num_groups=2,
                      requires_grad=True)), 32, every_norm_is(nn.GroupNorm)),
    'r18_zero_init_residual':
    (dict(depth=18, zero_init_residual=True), 32, residual_norms_zero),
    'r50_zero_init_residual':
    (dict(depth=50, base_channels=1,
          zero_init_residual=True), 32, residual_norms_zero),
    'plugins': (dict(
        depth=50,
        base_channels=8,
        plugins=[
            dict(
                cfg=GEN_ATTENTION,
                stages=(False, True, True, True),
                position='after_conv2'),
            dict(cfg=dict(type='NonLocal2d'), position='after_conv2'),
            dict(
                cfg=dict(type='ContextBlock', ratio=1. / 16),
                stages=(False, True, True, False),
                position='after_conv3')
        ]), 32,
                plugins_per_stage(
                    ['nonlocal_block'],
                    ['gen_attention_block', 'nonlocal_block', 'context_block'],
                    ['gen_attention_block', 'nonlocal_block', 'context_block'],
                    ['gen_attention_block', 'nonlocal_block'])),
    'two_context_blocks': (dict(
        depth=50,
        base_channels=8,
        plugins=[
            dict(
                cfg=dict(type='ContextBlock', ratio=1. / 16, postfix=i),
                stages=(False, True, True, False),
                position='after_conv3') for i in (1, 2)
        ]), 32,
                           plugins_per_stage(
                               [], ['context_block1', 'context_block2'],
                               ['context_block1', 'context_block2'], [])),
    'dcn': (dict(
        depth=50,
        base_channels=2,
        dcn=DCN,
        stage_with_dcn=(False, True, True, True)), 96,
            deform_conv_in((False, True, True, True))),
    'base_channels': (dict(depth=50, base_channels=3), 32, no_check),
    # The first stage strided too: its first block receives no state.
    'r18_first_stage_stride': (dict(depth=18,
                                    strides=(2, 2, 2, 2)), 64, no_check),
    'r50_first_stage_stride':
    (dict(depth=50, base_channels=1, strides=(2, 1, 2, 1)), 64, no_check),
    'stem_channels': (dict(depth=50, base_channels=2,
                           stem_channels=6), 32, stem_width(6)),
}
# mmdet's stem cases: stem_channels defaults to base_channels.
MMDET_STEM = {
    'r50': (dict(depth=50), 64),
    'base_channels_3': (dict(depth=50, base_channels=3), 3),
    'stem_channels_3': (dict(depth=50, stem_channels=3), 3),
    'stem_3_base_2': (dict(depth=50, stem_channels=3, base_channels=2), 3),
}


@pytest.mark.parametrize('case', list(OPTIONS))
@pytest.mark.parametrize('pair', PLAIN_PAIRS, ids=str)
def test_options(pair, case):
    kwargs, size, check = OPTIONS[case]
    ours, theirs = pair.build(**kwargs)
    check(theirs)
    check(ours)
    assert_same_outputs(ours, theirs, size)


# The deep-stem variants (V1c: deep_stem; V1d: deep_stem and avg_down).
DEEP_STEM = {
    'r18': OPTIONS['r18'],
    'r50_base_channels_2': (dict(depth=50, base_channels=2), 32, no_check),
    'base_channels': OPTIONS['base_channels'],
    'stem_channels': OPTIONS['stem_channels'],
}


@pytest.mark.parametrize('case', list(DEEP_STEM))
@pytest.mark.parametrize('pair', [p for p in PAIRS if p.variant], ids=str)
def test_deep_stem_variants(pair, case):
    kwargs, size, check = DEEP_STEM[case]
    ours, theirs = pair.build(**kwargs)
    assert ours.deep_stem and theirs.deep_stem
    assert ours.avg_down is theirs.avg_down is (pair.variant == 'V1d')
    check(theirs)
    check(ours)
    assert_same_outputs(ours, theirs, size)


@pytest.mark.parametrize('case', list(MMDET_STEM))
@pytest.mark.parametrize(
    'pair', [p for p in MMDET_PAIRS if not p.variant], ids=str)
def test_mmdet_stem_channels(pair, case):
    kwargs, stem_channels = MMDET_STEM[case]
    ours, theirs = pair.build(**kwargs)
    stem_width(stem_channels)(theirs)
    stem_width(stem_channels)(ours)


# ---------------------------------------------------------------------------
# mmseg's segmentation settings: the dilation of every block.
DILATED = {
    'contract_dilation_os8':
    dict(strides=(1, 2, 1, 1), dilations=(1, 1, 2, 4), contract_dilation=True),
    'multi_grid_os8':
    dict(
        strides=(1, 2, 1, 1),
        dilations=(1, 1, 2, 4),
        contract_dilation=True,
        multi_grid=(1, 2, 4)),
    'os16':
    dict(strides=(1, 2, 2, 1), dilations=(1, 1, 1, 2)),
    'multi_grid_os16':
    dict(
        strides=(1, 2, 2, 1),
        dilations=(1, 1, 1, 2),
        contract_dilation=True,
        multi_grid=(1, 2, 4)),
}


def dilations(model):
    return [[b.conv2.dilation for b in getattr(model, f'layer{i}')]
            for i in range(1, 5)]


@pytest.mark.parametrize('case', list(DILATED))
@pytest.mark.parametrize('pair', MMSEG_PAIRS, ids=str)
def test_mmseg_dilations(pair, case):
    ours, theirs = pair.build(depth=50, base_channels=2, **DILATED[case])
    assert dilations(ours) == dilations(theirs)
    # The case is not the plain ResNet.
    assert any(d != (1, 1) for stage in dilations(theirs) for d in stage)
    assert_same_outputs(ours, theirs)
