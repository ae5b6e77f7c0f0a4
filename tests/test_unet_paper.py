"""The official UNet-KCLA network in mmseg (issue 29, points 1 and 4): the
encoder layout (KCLA, LA, MRLA-light and the plain twin), the official
decoder, the base configs ``configs/_base_/models/unet-paper_*.py`` and the
converter from an official ``UNet_kcla`` checkpoint, checked against an
independent implementation of the official network
(``official_unet_reference.py``)."""
import os.path as osp

import pytest
import torch
from mmengine.config import Config
from mmengine.registry import init_default_scope
from mmengine.structures import PixelData
from mmseg.registry import MODELS
from mmseg.structures import SegDataSample
from official_unet_reference import OfficialUNetKCLANet, randomise_

from kcla_mm.models.backbones import (KCLAResNetUNetPaper, LAResNetUNetPaper,
                                      MRLALightResNetUNetPaper,
                                      ResNetUNetPaper)
from kcla_mm.models.official_checkpoint import OfficialCheckpointError
from kcla_mm.models.official_unet_checkpoint import (
    convert_official_unet_checkpoint, convert_official_unet_state_dict)
from helpers import ROOT, load_tool

BASE = osp.join(ROOT, 'configs', '_base_', 'models')
# Measured on the official network (UNet_kcla(3, 1)): all its parameters,
# those that require a gradient (norm_d does not), and those that get one.
OFFICIAL_TOTAL = 1_546_989
OFFICIAL_TRAINABLE = 1_546_945
OFFICIAL_USED = 1_545_569
# What the official network builds and its forward pass never calls.
NEVER_USED = {
    'encoder.bn2.weight': 512,
    'encoder.bn2.bias': 512,
    'encoder.layer1.attention.0.adjust_channel.0.weight': 256,
    'encoder.layer1.attention.0.adjust_channel.0.bias': 32,
    'encoder.layer1.attention.0.adjust_channel.1.weight': 32,
    'encoder.layer1.attention.0.adjust_channel.1.bias': 32,
}
ENCODER_SHAPES = [(16, 256, 256), (32, 128, 128), (64, 64, 64), (128, 32, 32),
                  (128, 32, 32)]


def trainable(module) -> int:
    return sum(p.numel() for p in module.parameters() if p.requires_grad)


def build_segmentor(name: str, **backbone):
    init_default_scope('mmseg')
    cfg = Config.fromfile(osp.join(BASE, f'unet-paper_{name}.py'))
    cfg.model.backbone.update(backbone)
    return MODELS.build(cfg.model)


def seg_batch(model, size=64, n=2, training=True):
    inputs = [
        torch.randint(0, 256, (3, size, size), dtype=torch.uint8)
        for _ in range(n)
    ]
    samples = []
    for _ in range(n):
        sample = SegDataSample()
        sample.gt_sem_seg = PixelData(
            data=torch.randint(0, 2, (1, size, size)))
        sample.set_metainfo(
            dict(
                img_shape=(size, size),
                ori_shape=(size, size),
                pad_shape=(size, size)))
        samples.append(sample)
    return model.data_preprocessor(
        dict(inputs=inputs, data_samples=samples), training)


def test_reference_is_the_measured_official_network():
    """The independent reference has the official parameter counts, and
    its forward pass leaves exactly the never-used modules without a
    gradient: what the converter test relies on."""
    ref = OfficialUNetKCLANet()
    assert sum(p.numel() for p in ref.parameters()) == OFFICIAL_TOTAL
    assert trainable(ref) == OFFICIAL_TRAINABLE
    ref(torch.rand(2, 3, 32, 32)).sum().backward()
    unused = {
        n: p.numel()
        for n, p in ref.named_parameters()
        if p.requires_grad and p.grad is None
    }
    assert unused == NEVER_USED
    assert OFFICIAL_TRAINABLE - sum(unused.values()) == OFFICIAL_USED


def test_kcla_segmentor_has_the_official_used_parameters():
    """Trainable parameters: exactly those the official network uses (the
    never-used ones are not built, norm_d is the buffer inv_tau)."""
    model = build_segmentor('kcla-r18')
    assert trainable(model) == OFFICIAL_USED
    assert trainable(model.backbone) + trainable(model.decode_head) == \
        OFFICIAL_USED
    assert not hasattr(model.backbone.layer1[0].kcla, 'state_adapt')
    assert model.backbone.layer4[0].kcla.state_adapt.bias is not None


@pytest.mark.parametrize('cls', [
    KCLAResNetUNetPaper, ResNetUNetPaper, LAResNetUNetPaper,
    MRLALightResNetUNetPaper
])
def test_encoder_outputs_have_the_official_shapes(cls):
    model = cls().eval()
    with torch.no_grad():
        outs = model(torch.rand(2, 3, 256, 256))
    assert [tuple(o.shape) for o in outs] == [(2, ) + s
                                              for s in ENCODER_SHAPES]


def test_stem_output_and_out_indices():
    model = ResNetUNetPaper(stem_output=False, out_indices=(1, 3)).eval()
    outs = model(torch.rand(1, 3, 32, 32))
    assert [tuple(o.shape[1:]) for o in outs] == [(64, 8, 8), (128, 4, 4)]


@pytest.mark.parametrize('name',
                         ['kcla-r18', 'r18', 'la-r18', 'mrla-light-r18'])
def test_segmentor_builds_and_trains_one_step(name):
    """Each base config builds by itself and gives a finite BCE + Dice
    loss and a gradient to every trainable parameter; prediction is one
    sigmoid channel thresholded at 0.5."""
    model = build_segmentor(name)
    size = 256 if name in ('kcla-r18', 'r18') else 64
    losses = model(**seg_batch(model, size), mode='loss')
    assert set(losses) == {
        'decode.loss_ce', 'decode.loss_dice', 'decode.acc_seg'
    }
    total = losses['decode.loss_ce'] + losses['decode.loss_dice']
    assert torch.isfinite(total)
    total.backward()
    no_grad = [
        n for n, p in model.named_parameters()
        if p.requires_grad and p.grad is None
    ]
    assert no_grad == []
    model.eval()
    with torch.no_grad():
        pred = model(**seg_batch(model, size, training=False), mode='predict')
    assert pred[0].seg_logits.data.shape == (1, size, size)
    assert set(pred[0].pred_sem_seg.data.unique().tolist()) <= {0, 1}
    assert model.decode_head.threshold == 0.5


def test_twin_differs_only_by_kcla():
    kcla, plain = build_segmentor('kcla-r18'), build_segmentor('r18')
    assert type(plain.backbone) is ResNetUNetPaper
    plain_keys = set(plain.state_dict())
    kcla_keys = set(kcla.state_dict())
    assert plain_keys <= kcla_keys
    assert all('.kcla.' in k for k in kcla_keys - plain_keys)
    assert trainable(plain) == 1_533_217


@pytest.mark.parametrize('kwargs, message', [
    (dict(stage_planes=(32, 64, 128)), 'stage_planes=(32, 64, 128) must '
     'have num_stages=4'),
    (dict(base_channels=32), 'base_channels does not apply'),
    (dict(deep_stem=True), 'deep_stem=True does not apply'),
    (dict(stem_output='no'), "stem_output='no'"),
    (dict(head_dim=48), 'head_dim=48 must divide every stage width'),
    (dict(renorm_blocks=(1, )), 'renorm_blocks=(1,) must'),
    (dict(carry_state='False'), "carry_state='False'"),
    (dict(kcla_drop_path=1.), 'kcla_drop_path=1.0'),
    (dict(temperature_range=(1.4, 0.7)), 'temperature_range'),
])
def test_bad_options_are_named(kwargs, message):
    with pytest.raises((ValueError, TypeError)) as info:
        KCLAResNetUNetPaper(**kwargs)
    assert message in str(info.value)


def convert_into(model, official, source='<test>'):
    result = convert_official_unet_state_dict(official.state_dict(), source)
    model.load_state_dict(result.state_dict, strict=True)
    return result


def logits(model, x):
    return model.decode_head(model.backbone(x))


@pytest.mark.parametrize('carry_state', [True, False])
def test_converted_official_network_gives_the_same_output(carry_state):
    """A random official network, converted, gives the reference's logits:
    with the state carried (the paper, kcla_mm's default) against the
    reference that keeps it, and with ``carry_state=False`` against the
    reference that forgets it as the official file does."""
    official = randomise_(OfficialUNetKCLANet(keep_state=carry_state))
    model = build_segmentor('kcla-r18', carry_state=carry_state)
    result = convert_into(model, official)
    assert sorted(result.dropped) == sorted(
        [k for k in official.state_dict() if k.startswith('encoder.bn2.')] + [
            k for k in official.state_dict()
            if k.startswith('encoder.layer1.attention.0.adjust_channel.')
        ])
    official.eval()
    model.eval()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        want, got = official(x), logits(model, x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_the_official_state_drop_changes_the_output():
    """The same converted weights give another output with the state
    carried: the comparison above does see the difference."""
    official = randomise_(OfficialUNetKCLANet(keep_state=False)).eval()
    model = build_segmentor('kcla-r18').eval()
    convert_into(model, official)
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        diff = (logits(model, x) - official(x)).abs().max()
    assert diff > 1e-2


def test_training_forward_and_gradients_match_float64(float64):
    """Train mode (batch statistics; drop path off on both sides, its
    random draws differ), in float64: outputs and the gradient of every
    converted parameter."""
    official = randomise_(OfficialUNetKCLANet(keep_state=True))
    for module in official.modules():
        if hasattr(module, 'drop_path'):
            module.drop_path = 0.
    model = build_segmentor('kcla-r18', kcla_drop_path=0.)
    convert_into(model, official)
    official.train()
    model.train()
    x = torch.randn(2, 3, 32, 48)
    want, got = official(x), logits(model, x)
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)
    (want * want).mean().backward()
    (got * got).mean().backward()
    from kcla_mm.models.official_unet_checkpoint import official_unet_to_mm_key
    params = dict(model.named_parameters())
    for name, p in official.named_parameters():
        if p.grad is None:  # norm_d and the never-used modules
            continue
        mine = params[official_unet_to_mm_key(name)].grad
        torch.testing.assert_close(
            mine, p.grad.reshape(mine.shape), rtol=1e-7, atol=1e-12, msg=name)


def test_wrong_shape_missing_and_foreign_keys_are_named():
    state = OfficialUNetKCLANet().state_dict()
    bad = dict(state)
    bad['up2.conv.double_conv.0.weight'] = torch.zeros(32, 64, 3, 3)
    with pytest.raises(OfficialCheckpointError) as info:
        convert_official_unet_state_dict(bad, 'bad.pth')
    assert ("bad.pth: key 'up2.conv.double_conv.0.weight' has shape "
            '(32, 64, 3, 3)') in str(info.value)
    assert "'decode_head.up_steps.1.convs.0.conv.weight'" in str(info.value)

    missing = dict(state)
    del missing['encoder.layer3.attention.1.Wv.weight']
    with pytest.raises(OfficialCheckpointError) as info:
        convert_official_unet_state_dict(missing, 'missing.pth')
    assert "['backbone.layer3.1.kcla.value_conv.weight']" in str(info.value)

    foreign = dict(state, **{'encoder.fc.weight': torch.zeros(1)})
    with pytest.raises(OfficialCheckpointError) as info:
        convert_official_unet_state_dict(foreign, 'foreign.pth')
    assert "key 'encoder.fc.weight' is not of the official UNet_kcla" in str(
        info.value)

    # Only what the official network builds and never calls is dropped:
    # an adapter where it builds none, or another tensor under bn2, is
    # named.
    for key in ('encoder.layer2.attention.1.adjust_channel.0.weight',
                'encoder.bn2.anything_else'):
        with pytest.raises(OfficialCheckpointError) as info:
            convert_official_unet_state_dict(
                dict(state, **{key: torch.zeros(1)}), 'extra.pth')
        assert f"extra.pth: key '{key}'" in str(info.value)


def test_tool_converts_a_training_checkpoint(tmp_path, capsys):
    """The official ``latest.pth`` layout (``model_state_dict`` beside the
    optimizer's, DataParallel's prefix) converts through the tool; the
    output loads into the segmentor and the dropped keys are printed."""
    official = randomise_(OfficialUNetKCLANet())
    torch.save(
        dict(
            model_state_dict={
                f'module.{k}': v
                for k, v in official.state_dict().items()
            },
            optimizer_state_dict=torch.optim.AdamW(
                official.parameters()).state_dict(),
            epoch=3), tmp_path / 'latest.pth')
    tool = load_tool('tools/model_converters/kcla_unet_official2mm.py')
    assert tool.main([str(tmp_path / 'latest.pth'),
                      str(tmp_path / 'out.pth')]) == 0
    out = capsys.readouterr().out
    assert 'model.backbone.carry_state=False' in out
    assert '  encoder.bn2.weight  (never used' in out
    assert '  encoder.layer1.attention.0.adjust_channel.0.weight' in out
    ckpt = torch.load(tmp_path / 'out.pth', weights_only=True)
    build_segmentor('kcla-r18').load_state_dict(
        ckpt['state_dict'], strict=True)
    assert ckpt['meta']['config'] == \
        'configs/_base_/models/unet-paper_kcla-r18.py'

    torch.save({'conv.weight': torch.zeros(1)}, tmp_path / 'other.pth')
    assert tool.main([str(tmp_path / 'other.pth'),
                      str(tmp_path / 'o.pth')]) == 1
    assert 'is not an official UNet_kcla checkpoint' in \
        capsys.readouterr().err
    assert not (tmp_path / 'o.pth').exists()
    with pytest.raises(OfficialCheckpointError, match='no such file'):
        convert_official_unet_checkpoint(str(tmp_path / 'none.pth'))


def test_tool_creates_the_output_folder(tmp_path, capsys):
    torch.save(
        randomise_(OfficialUNetKCLANet()).state_dict(), tmp_path / 'best.pth')
    out = tmp_path / 'checkpoints' / 'unet' / 'unet-paper_kcla-r18.pth'
    tool = load_tool('tools/model_converters/kcla_unet_official2mm.py')
    assert tool.main([str(tmp_path / 'best.pth'), str(out)]) == 0
    assert f'the configs built on it: {out}' in capsys.readouterr().out
    ckpt = torch.load(out, weights_only=True)
    build_segmentor('kcla-r18').load_state_dict(
        ckpt['state_dict'], strict=True)
