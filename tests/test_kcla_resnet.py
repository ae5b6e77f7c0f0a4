"""KCLAResNet: registries, every mmdet ResNet option, bad input, AMP."""
import copy

import pytest
import torch
import torch.nn as nn
from mmdet.models.backbones import ResNet
from mmdet.registry import MODELS as MMDET_MODELS
from mmengine.model import revert_sync_batchnorm
from mmseg.registry import MODELS as MMSEG_MODELS
from torch.nn.modules.batchnorm import _BatchNorm

from kcla_mm.models import KCLAResNet
from kcla_mm.models.backbones import MMSegKCLAResNet
from kcla_mm.models.layers import KCLALayer
from helpers import small_backbone

# Official trainable parameters (measured on github bgx666/KCLA,
# imagenet/kcla_resnet.py) minus the 1000-class fc head (2,049,000) and
# minus the parameters the official forward never uses (8,709 for R50:
# stage 1 block 0's adaptation conv, key conv and BN; 41,477 for R101:
# also block 11 of stage 3's adaptation conv).
OFFICIAL_TRAINABLE = {50: 25_858_842, 101: 45_081_801}
OFFICIAL_FC = 2_049_000
OFFICIAL_UNUSED = {50: 8_709, 101: 41_477}


def trainable(model):
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def small(depth=18, **kwargs):
    return small_backbone(KCLAResNet, depth, **kwargs)


@pytest.mark.parametrize(
    'registry', [MMDET_MODELS, MMSEG_MODELS], ids=['mmdet', 'mmseg'])
@pytest.mark.parametrize('depth', [18, 34, 50, 101, 152])
def test_shapes_for_every_depth_from_both_registries(registry, depth):
    model = registry.build(
        dict(type='KCLAResNet', depth=depth, base_channels=16, head_dim=16))
    # mmseg's registry holds the class over mmseg's ResNet.
    assert type(model) is (KCLAResNet
                           if registry is MMDET_MODELS else MMSegKCLAResNet)
    model.eval()
    expansion = 1 if depth < 50 else 4
    with torch.no_grad():
        outs = model(torch.rand(1, 3, 64, 64))
    assert [tuple(o.shape) for o in outs] == [
        (1, 16 * 2**i * expansion, 16 // 2**i, 16 // 2**i) for i in range(4)
    ]


@pytest.mark.parametrize('depth', [50, 101])
def test_trainable_parameters_equal_official_minus_head_and_unused(depth):
    model = KCLAResNet(depth=depth)
    expected = (
        OFFICIAL_TRAINABLE[depth] - OFFICIAL_FC - OFFICIAL_UNUSED[depth])
    assert trainable(model) == expected  # 23,801,133 / 42,991,324


@pytest.mark.parametrize('depth', [50, 101])
def test_every_parameter_gets_a_gradient(depth):
    """No never-used parameters, so DDP needs no find_unused_parameters."""
    model = KCLAResNet(depth=depth, norm_eval=False).train()
    outs = model(torch.rand(2, 3, 64, 64))
    sum(o.mean() for o in outs).backward()
    unused = [n for n, p in model.named_parameters() if p.grad is None]
    assert unused == []


def test_odd_sizes_strides_and_dilations_match_mmdet_resnet():
    cfg = dict(
        depth=50,
        strides=(1, 2, 2, 1),
        dilations=(1, 1, 1, 2),
        base_channels=16)
    ours = KCLAResNet(head_dim=16, **cfg).eval()
    plain = ResNet(**cfg)
    plain.eval()  # mmdet's ResNet.eval() returns None
    x = torch.rand(2, 3, 97, 131)
    with torch.no_grad():
        got = [tuple(o.shape) for o in ours(x)]
        want = [tuple(o.shape) for o in plain(x)]
    assert got == want == [(2, 64, 25, 33), (2, 128, 13, 17), (2, 256, 7, 9),
                           (2, 512, 7, 9)]
    # The last stage keeps the size: its state adaptation must not stride.
    adapt = ours.layer4[0].kcla.state_adapt
    assert adapt.stride == (1, 1) and ours.layer2[0].kcla.state_adapt.stride \
        == (2, 2)


@pytest.mark.parametrize('kwargs', [
    dict(style='caffe'),
    dict(deep_stem=True, avg_down=True),
    dict(in_channels=1),
    dict(
        num_stages=3,
        out_indices=(0, 2),
        strides=(1, 2, 2),
        dilations=(1, 1, 1)),
    dict(conv_cfg=dict(type='Conv2d'), norm_cfg=dict(type='GN', num_groups=4)),
    dict(zero_init_residual=False),
])
def test_mmdet_resnet_options_are_kept(kwargs):
    ours = small(**kwargs)
    plain = ResNet(depth=18, base_channels=16, **kwargs)
    # Every mmdet parameter is still there under its own name.
    plain_keys = set(plain.state_dict())
    assert plain_keys <= set(ours.state_dict())
    assert all('.kcla.' in k for k in set(ours.state_dict()) - plain_keys)
    ours.init_weights()
    ours.train()
    x = torch.rand(2, kwargs.get('in_channels', 3), 48, 48)
    outs = ours(x)
    plain.eval()
    with torch.no_grad():
        want = [o.shape for o in plain(x)]
    assert [o.shape for o in outs] == want
    sum(o.mean() for o in outs).backward()
    if 'norm_cfg' in kwargs:
        assert isinstance(ours.layer1[0].kcla.norm, nn.GroupNorm)


def test_frozen_stages_freeze_blocks_and_their_kcla_layers():
    model = small(frozen_stages=2, norm_eval=False)
    # Applied in __init__ already.
    frozen = [model.conv1, model.norm1, model.layer1, model.layer2]
    assert not any(p.requires_grad for m in frozen for p in m.parameters())
    assert all(p.requires_grad for p in model.layer3.parameters())
    model.train()
    for m in frozen:
        assert all(not b.training for b in m.modules()
                   if isinstance(b, _BatchNorm))
    assert model.layer3[0].kcla.norm.training
    kcla_bn = model.layer2[1].kcla.norm
    before = kcla_bn.running_mean.clone()
    outs = model(torch.rand(2, 3, 64, 64))
    sum(o.mean() for o in outs).backward()
    assert torch.equal(kcla_bn.running_mean, before)
    for m in frozen:
        assert all(p.grad is None for p in m.parameters())
    assert model.layer3[0].kcla.value_conv.weight.grad.abs().sum() > 0


def test_norm_eval_keeps_every_bn_in_eval_mode():
    model = small(norm_eval=True)
    model.train()
    bns = [m for m in model.modules() if isinstance(m, _BatchNorm)]
    assert bns and all(not m.training for m in bns)
    stats = copy.deepcopy([m.running_var for m in bns])
    model(torch.rand(2, 3, 64, 64))
    assert all(torch.equal(a, m.running_var) for a, m in zip(stats, bns))
    model = small(norm_eval=False)
    model.train()
    assert all(m.training for m in model.modules()
               if isinstance(m, _BatchNorm))


def test_syncbn_config_runs_on_cpu_after_revert():
    model = small(norm_cfg=dict(type='SyncBN', requires_grad=True))
    assert isinstance(model.layer1[0].kcla.norm, nn.SyncBatchNorm)
    model = revert_sync_batchnorm(model)
    assert not any(isinstance(m, nn.SyncBatchNorm) for m in model.modules())
    model.train()
    outs = model(torch.rand(2, 3, 64, 64))
    sum(o.mean() for o in outs).backward()
    model.eval()
    with torch.no_grad():
        assert all(
            torch.isfinite(o).all() for o in model(torch.rand(1, 3, 64, 64)))


@pytest.mark.parametrize('batch', [1, 2])
def test_channels_last_model_gives_channels_last_outputs_of_equal_value(batch):
    torch.manual_seed(0)
    nchw = small()
    nchw.init_weights()
    nhwc = copy.deepcopy(nchw).to(memory_format=torch.channels_last)
    # The state too: one in the other format costs a transposing copy at
    # every update (measured: eval forward 1.4x ResNet-50 instead of 1.2x).
    state_formats = []
    for module in nhwc.modules():
        if isinstance(module, KCLALayer):
            module.register_forward_hook(
                lambda mod, args, out: state_formats.append(out[
                    1].u.is_contiguous(memory_format=torch.channels_last)))
    x = torch.rand(batch, 3, 61, 75)
    for mode in (True, False):
        nchw.train(mode)
        nhwc.train(mode)
        torch.manual_seed(1)  # same drop-path masks
        expected = nchw(x)
        torch.manual_seed(1)
        outs = nhwc(x.contiguous(memory_format=torch.channels_last))
        for out, ref in zip(outs, expected):
            assert out.is_contiguous(memory_format=torch.channels_last)
            torch.testing.assert_close(
                out, ref, rtol=1e-4, atol=1e-5 * ref.abs().max().item())
    assert len(state_formats) == 2 * 8 and all(state_formats)


def cpu_autocast_takes(dtype):
    """Whether this torch autocasts to ``dtype`` on the CPU (torch 2.1 takes
    only bfloat16 there)."""
    try:
        with torch.autocast('cpu', dtype=dtype):
            return True
    except RuntimeError:
        return False


@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16])
def test_autocast_state_does_not_overflow_at_depth_152(dtype):
    if not cpu_autocast_takes(dtype):
        pytest.skip(f'torch {torch.__version__} has no {dtype} autocast on '
                    'the CPU (only bfloat16); the main stack runs it')
    torch.manual_seed(0)
    model = KCLAResNet(depth=152, base_channels=16, head_dim=16).train()
    model.init_weights()
    # Push every layer weight to its clamp, e^10: the official fp16 sum of
    # 36 such terms in stage 3 exceeds the fp16 maximum (65504).
    for m in model.modules():
        if isinstance(m, KCLALayer):
            nn.init.constant_(m.key_conv.weight, 10.)
    peaks = []
    model.layer3[-1].kcla.register_forward_hook(
        lambda m, i, out: peaks.append(out[1].u.abs().max().item()))
    x = torch.rand(2, 3, 64, 64)
    with torch.autocast('cpu', dtype=dtype):
        outs = model(x)
        loss = sum(o.float().mean() for o in outs)
    loss.backward()
    assert peaks[0] > torch.finfo(torch.float16).max
    assert all(o.dtype == dtype for o in outs)
    assert all(torch.isfinite(o).all() for o in outs)
    assert all(
        torch.isfinite(p.grad).all() for p in model.parameters()
        if p.grad is not None)


@pytest.mark.parametrize('kwargs, message', [
    (dict(depth=42), 'depth=42'),
    (dict(depth=50, strides=(1, 2, 2)), r'strides=\(1, 2, 2\)'),
    (dict(depth=50,
          dilations=(1, 1, 1, 1, 1)), r'dilations=\(1, 1, 1, 1, 1\)'),
    (dict(depth=18, head_dim=48), 'head_dim=48'),
])
def test_bad_arguments_name_the_field(kwargs, message):
    with pytest.raises(ValueError, match=message):
        KCLAResNet(**kwargs)


def test_train_and_eval_return_the_module():
    model = small()
    assert model.eval() is model and model.train() is model
