"""The layer-attention backbones of mmseg's registry: mmseg's ResNet
options and keys, the V1c/V1d variants, the KCLA state across dilated
stride-1 stages against the official equations, and argument errors of
both kinds."""
import pytest
import torch
from mmdet.models.backbones import ResNet as MMDetResNet
from mmseg.models.backbones import ResNet as MMSegResNet
from mmseg.models.backbones import ResNetV1c, ResNetV1d
from mmseg.registry import MODELS as MMSEG_MODELS

from kcla_mm.models import KCLAResNet
from kcla_mm.models.backbones import (MMSegKCLAResNet, MMSegKCLAResNetV1c,
                                      MMSegKCLAResNetV1d)
from kcla_mm.models.backbones.cross_layer_resnet import MMSegCrossLayerResNet
from helpers import assert_close_to_max
from official_reference import OFFICIAL_TO_MM, OfficialKCLA, randomise_

ATTENTION = {
    'KCLAResNet': 'kcla',
    'LAResNet': 'la',
    'MRLALightResNet': 'mrla_light'
}
UPSTREAM = {'': MMSegResNet, 'V1c': ResNetV1c, 'V1d': ResNetV1d}
# mmseg's output-stride 8 and 16 settings (e.g. deeplabv3plus_r50-d8 and
# -d16 in mmseg's configs).
OUTPUT_STRIDE = {
    8: dict(strides=(1, 2, 1, 1), dilations=(1, 1, 2, 4)),
    16: dict(strides=(1, 2, 2, 1), dilations=(1, 1, 1, 2)),
}


@pytest.mark.parametrize('variant', list(UPSTREAM))
@pytest.mark.parametrize('name', list(ATTENTION))
def test_every_variant_is_mmseg_resnet_plus_attention(name, variant):
    """mmseg's ResNet with its segmentation options: the same keys and
    shapes plus the attention's, the same dilations, the same output
    sizes."""
    kwargs = dict(
        depth=50,
        base_channels=8,
        stem_channels=16,
        contract_dilation=True,
        multi_grid=(1, 2, 4),
        **OUTPUT_STRIDE[8])
    model = MMSEG_MODELS.build(dict(type=name + variant, head_dim=8, **kwargs))
    assert isinstance(model, MMSegCrossLayerResNet)
    plain = UPSTREAM[variant](**kwargs)
    ours = {k: v.shape for k, v in model.state_dict().items()}
    theirs = {k: v.shape for k, v in plain.state_dict().items()}
    attr = ATTENTION[name]
    assert {k: ours[k] for k in theirs} == theirs
    assert all(f'.{attr}.' in k for k in set(ours) - set(theirs))
    assert (model.deep_stem, model.avg_down) == (plain.deep_stem,
                                                 plain.avg_down)
    dilations = [[b.conv2.dilation for b in getattr(m, f'layer{i}')]
                 for m in (model, plain) for i in range(1, 5)]
    assert dilations[:4] == dilations[4:]
    # contract_dilation halves the first dilation of stage 3; multi_grid
    # sets those of the last stage.
    assert dilations[2][:2] == [(1, 1), (2, 2)]
    assert dilations[3] == [(1, 1), (2, 2), (4, 4)]
    model.train()
    x = torch.rand(2, 3, 40, 40)
    outs = model(x)
    plain.eval()
    with torch.no_grad():
        assert [o.shape for o in outs] == [o.shape for o in plain(x)]
    assert outs[-1].shape[-2:] == (5, 5)  # output stride 8
    sum(o.mean() for o in outs).backward()
    assert [n for n, p in model.named_parameters() if p.grad is None] == []


def test_mmseg_defaults_and_stem_width():
    model = MMSegKCLAResNet(depth=18, head_dim=32)
    plain = MMSegResNet(depth=18)
    assert (model.norm_eval, model.zero_init_residual,
            model.contract_dilation) == (False, True, False)
    assert model.stem_channels == plain.stem_channels == 64
    # stem_channels None is base_channels, as in the classes these replace
    # in mmseg's registry (existing narrow UNet encoders keep their keys).
    narrow = MMSegKCLAResNet(depth=18, base_channels=32, head_dim=16)
    assert narrow.conv1.out_channels == 32
    assert MMSegKCLAResNet(
        depth=18, base_channels=32, stem_channels=64,
        head_dim=16).conv1.out_channels == 64
    # The mmdet registry keeps mmdet's class and defaults.
    assert KCLAResNet(depth=18).norm_eval is True


def official_twin(layer, stride):
    """The official KCLA module (tests/official_reference.py) holding the
    weights of ``layer``."""
    ref = OfficialKCLA(
        layer.channels,
        init_layer=layer.renorm,
        stride=stride,
        head=layer.head_dim)
    to_official = {v: k for k, v in OFFICIAL_TO_MM.items()}
    state = {}
    for key, value in layer.state_dict().items():
        module, _, rest = key.partition('.')
        if module == 'tau':
            state['norm_d'] = value.view(1, -1, 1, 1, 1)
        else:
            state[f'{to_official[module]}.{rest}'] = value
    ref.load_state_dict(state, strict=True)
    return ref


def reference_stages(plain, twins, x, forget_at=None):
    """mmseg's own ResNetV1c blocks, each followed by the official KCLA
    equations, the state (U, Z) threaded by hand; ``forget_at`` drops the
    state at the start of that stage (a broken carry, for contrast)."""
    x = plain.maxpool(plain.stem(x))
    u = z = None
    outs = []
    for i, name in enumerate(plain.res_layers):
        if i == forget_at:
            u = z = None
        for block, twin in zip(getattr(plain, name), twins[i]):
            x, u, z = twin(block(x), u, z)
        outs.append(x)
    return outs


@pytest.mark.parametrize('mode', ['train', 'eval'])
@pytest.mark.parametrize('output_stride', [8, 16])
def test_state_crosses_dilated_stages_as_the_official_equations(
        float64, output_stride, mode):
    """KCLAResNetV1c at output stride 8 / 16 against an independent
    computation: mmseg's ResNetV1c for the blocks and the official KCLA
    equations for the layers, forward and backward, in float64."""
    setting = OUTPUT_STRIDE[output_stride]
    kwargs = dict(
        depth=50,
        base_channels=8,
        stem_channels=8,
        contract_dilation=True,
        **setting)
    ours = MMSegKCLAResNetV1c(
        head_dim=16,
        kcla_drop_path=0.,
        kcla_implementation='reference',
        **kwargs)
    randomise_(ours)
    plain = ResNetV1c(**kwargs)
    plain.load_state_dict({
        k: v
        for k, v in ours.state_dict().items() if '.kcla.' not in k
    })
    twins = [[
        official_twin(block.kcla, stride if j == 0 else 1)
        for j, block in enumerate(getattr(ours, name))
    ] for name, stride in zip(ours.res_layers, setting['strides'])]
    # Algorithm 1's adapter strides with its stage: not at all in the
    # dilated ones.
    assert [
        ours.layer2[0].kcla.state_adapt.stride,
        ours.layer3[0].kcla.state_adapt.stride,
        ours.layer4[0].kcla.state_adapt.stride
    ] == [(s, s) for s in setting['strides'][1:]]
    for module in (ours, plain, *sum(twins, [])):
        module.train(mode == 'train')

    x = torch.rand(2, 3, 48, 48, requires_grad=True)
    got = ours(x)
    want = reference_stages(plain, twins, x)
    assert [o.shape[-1] for o in got] == [12, 6, 6, 6] if output_stride == 8 \
        else [12, 6, 3, 3]
    for a, b in zip(got, want):
        assert_close_to_max(a, b, 1e-10)
    # The comparison has teeth: a state dropped at stage 3 is far off.
    with torch.no_grad():
        forgot = reference_stages(plain, twins, x, forget_at=2)
    assert (forgot[-1] - want[-1]).abs().max() > 1e-2 * want[-1].abs().max()

    weights = [torch.randn_like(o) for o in got]
    ours_params = dict(ours.named_parameters())
    ref_params = {
        **{
            k: p
            for k, p in plain.named_parameters()
        },
        **{
            f'{name}.{j}.kcla.{OFFICIAL_TO_MM[k.partition(".")[0]]}.'
            f'{k.partition(".")[2]}':
            p
            for name, stage in zip(plain.res_layers, twins)
            for j, twin in enumerate(stage)
            for k, p in twin.named_parameters() if p.requires_grad
        }
    }
    assert set(ref_params) == set(ours_params)
    names = sorted(ours_params)
    g = torch.autograd.grad(
        sum((o * w).sum() for o, w in zip(got, weights)),
        [x] + [ours_params[n] for n in names])
    g_ref = torch.autograd.grad(
        sum((o * w).sum() for o, w in zip(want, weights)),
        [x] + [ref_params[n] for n in names])
    for name, a, b in zip(['input'] + names, g, g_ref):
        torch.testing.assert_close(
            a, b, rtol=1e-8, atol=1e-10 * b.abs().max().item(), msg=name)


@pytest.mark.parametrize(
    'cls, upstream', [(KCLAResNet, MMDetResNet),
                      (MMSegKCLAResNet, MMSegResNet),
                      (MMSegKCLAResNetV1d, ResNetV1d)],
    ids=['mmdet', 'mmseg', 'mmseg-V1d'])
@pytest.mark.parametrize('kwargs, message, error', [
    (dict(depth=20), 'depth=20', KeyError),
    (dict(depth=50, num_stages=0), 'num_stages=0', AssertionError),
    (dict(depth=18, num_stages=5), 'num_stages=5', AssertionError),
    (dict(depth=18, strides=(1, ), dilations=(1, 1), num_stages=3),
     r'strides=\(1,\) must have num_stages=3', AssertionError),
    (dict(depth=50, dilations=(1, 1, 1, 1, 1)), r'dilations=\(1, 1, 1, 1, 1\)',
     AssertionError),
    (dict(depth=50, num_stages=3, strides=(1, 2, 2), dilations=(1, 1, 1)),
     r'out_indices=\(0, 1, 2, 3\) must be below', AssertionError),
])
def test_errors_name_the_field_and_are_the_upstream_type(
        cls, upstream, kwargs, message, error):
    # What mmdet's / mmseg's ResNet raises for the same input...
    with pytest.raises(error):
        upstream(**kwargs)
    # ... and ours: that type too, and a ValueError naming the field.
    with pytest.raises(error, match=message) as info:
        cls(head_dim=8, **kwargs)
    assert isinstance(info.value, ValueError)
    # KeyError's own __str__ would quote the message.
    assert str(info.value).startswith(message.split('=')[0])
    with pytest.raises(ValueError, match=message):
        cls(head_dim=8, **kwargs)
