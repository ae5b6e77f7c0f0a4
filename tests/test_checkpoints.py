"""Official checkpoint conversion (ImageNet and CIFAR models, backbone and
classifier) and Pretrained init_cfg paths."""
import os.path as osp
import sys

import pytest
import torch
from mmdet.models.backbones import ResNet
from official_cifar_reference import OfficialKCLACIFAR

from kcla_mm.models import KCLAResNet, KCLAResNetCIFAR
from kcla_mm.models.official_checkpoint import (OfficialCheckpointError,
                                                convert_official_checkpoint,
                                                official_to_mm_key)
from helpers import ROOT, requires_mmpretrain, run
from official_reference import OfficialKCLAResNet, randomise_


def convert(repo_root, src, dst, *flags):
    return run(
        sys.executable,
        'tools/model_converters/kcla_official2mm.py',
        *flags,
        src,
        dst,
        check=False)


def dropped_keys(result):
    return {
        line.split()[0]
        for line in result.stdout.splitlines() if line.startswith('  ')
    }


def save_official(model, path):
    """The layout of the official train.py: DataParallel keys, optimizer."""
    torch.save(
        dict(
            epoch=100,
            arch='resnet50_kcla',
            state_dict={
                f'module.{k}': v
                for k, v in model.state_dict().items()
            },
            best_acc1=torch.tensor(77.78),
            optimizer=torch.optim.SGD(model.parameters(),
                                      lr=0.1).state_dict()), path)


@pytest.mark.parametrize('depth', [50, 101])
@pytest.mark.slow
def test_converted_official_checkpoint_gives_the_same_features(
        depth, tmp_path, repo_root):
    official = randomise_(OfficialKCLAResNet(depth)).eval()
    save_official(official, tmp_path / 'official.pth.tar')
    result = convert(repo_root, tmp_path / 'official.pth.tar',
                     tmp_path / 'kcla.pth')
    assert result.returncode == 0, result.stderr
    dropped = [
        line.split()[0] for line in result.stdout.splitlines()
        if line.startswith('  ')
    ]
    unused = [
        'layer1.attention.0.adjust_channel.weight',
        'layer1.attention.0.u_Wk.weight', 'layer1.attention.0.u_bn.weight'
    ]
    if depth == 101:
        unused.append('layer3.attention.11.adjust_channel.weight')
    assert set(['fc.weight', 'fc.bias'] + unused) <= set(dropped)
    assert not any('layers' in k for k in dropped)

    # Exactly the backbone's keys: strict loading succeeds.
    ckpt = torch.load(tmp_path / 'kcla.pth', weights_only=True)
    # No classifier config: its keys are backbone.*, these are not.
    assert ckpt['meta']['config'] is None
    KCLAResNet(depth=depth).load_state_dict(ckpt['state_dict'], strict=True)

    model = KCLAResNet(
        depth=depth,
        init_cfg=dict(
            type='Pretrained', checkpoint=str(tmp_path / 'kcla.pth')))
    model.init_weights()
    model.eval()
    x = torch.rand(2, 3, 97, 131)
    with torch.no_grad():
        want = official.stages(x)
        got = model(x)
    for a, b in zip(got, want):
        assert (a - b).abs().max() <= 1e-4 * b.abs().max()


@pytest.mark.slow
def test_training_forward_and_gradients_match_official_float64(
        float64, tmp_path, repo_root):
    official = randomise_(OfficialKCLAResNet(50))
    save_official(official, tmp_path / 'official.pth')
    assert convert(repo_root, tmp_path / 'official.pth',
                   tmp_path / 'kcla.pth').returncode == 0
    model = KCLAResNet(depth=50, norm_eval=False, kcla_drop_path=0.)
    model.load_state_dict(torch.load(tmp_path / 'kcla.pth')['state_dict'])
    official.train()
    model.train()
    x = torch.rand(2, 3, 65, 47)
    want, got = official.stages(x), model(x)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)
    sum((o * o).mean() for o in want).backward()
    sum((o * o).mean() for o in got).backward()
    params = dict(model.named_parameters())
    for name, p in official.named_parameters():
        if p.grad is None:  # fc and the never-used modules
            continue
        mine = params[official_to_mm_key(name)].grad
        torch.testing.assert_close(
            mine, p.grad.reshape(mine.shape), rtol=1e-7, atol=1e-12, msg=name)


@pytest.mark.slow
def test_converter_rejects_other_files(tmp_path, repo_root):
    (tmp_path / 'notes.txt').write_text('not a checkpoint')
    result = convert(repo_root, tmp_path / 'notes.txt', tmp_path / 'o.pth')
    assert result.returncode == 1
    assert 'notes.txt is not a loadable torch checkpoint' in result.stderr

    torch.save({'state_dict': ResNet(depth=50).state_dict()},
               tmp_path / 'resnet.pth')
    result = convert(repo_root, tmp_path / 'resnet.pth', tmp_path / 'o.pth')
    assert result.returncode == 1
    assert ("no 'layer1.attention.*' keys (ImageNet model) and no "
            "'stages.0.0.kcla.*' keys (CIFAR model)") in result.stderr
    assert not (tmp_path / 'o.pth').exists()

    result = convert(repo_root, tmp_path / 'missing.pth', tmp_path / 'o.pth')
    assert result.returncode == 1 and 'no such file' in result.stderr


def test_converter_names_the_key_that_holds_the_weights(tmp_path):
    """A file that keeps the official weights under a key the converter
    does not read (here 'model', as some training scripts save) is refused
    with a message that names that key, not only the file's top keys."""
    state = {
        f'module.{k}': v
        for k, v in OfficialKCLAResNet(50).state_dict().items()
    }
    torch.save({
        'model': state,
        'epoch': 3,
        'ema': {
            0: torch.zeros(1)
        }
    }, tmp_path / 'nested.pth')
    with pytest.raises(OfficialCheckpointError) as error:
        convert_official_checkpoint(str(tmp_path / 'nested.pth'))
    message = str(error.value)
    assert "found e.g. ['ema', 'epoch', 'model']" in message
    assert "the weights are under 'model'" in message
    assert "one under 'state_dict'" in message
    # Keys that are not names are told apart from the weights, not a crash.
    torch.save({0: torch.zeros(1)}, tmp_path / 'indexed.pth')
    with pytest.raises(OfficialCheckpointError, match=r"found e.g. \['0'\]"):
        convert_official_checkpoint(str(tmp_path / 'indexed.pth'))
    state[7] = torch.zeros(1)
    torch.save({'state_dict': state}, tmp_path / 'mixed.pth')
    with pytest.raises(
            OfficialCheckpointError,
            match=r'keys that are not parameter names: \[7\]'):
        convert_official_checkpoint(str(tmp_path / 'mixed.pth'))


@pytest.mark.parametrize(
    'key',
    [
        # Algorithm 1's modules where the official model builds none.
        'layer1.attention.1.adjust_channel.weight',
        'layer2.attention.3.u_bn.weight',
        'layer2.attention.2.u_Wk.weight',
        # A re-normalisation that changes the width has its adapter mapped,
        # so an unknown tensor of it is no official one.
        'layer2.attention.0.u_bn.extra',
    ])
def test_converter_refuses_state_modules_the_official_model_lacks(
        tmp_path, key):
    """Only the state modules that the official model builds and never
    calls are dropped as unused; one it does not build is named."""
    state = OfficialKCLAResNet(50).state_dict()
    state[key] = torch.zeros(3)
    torch.save({'state_dict': state}, tmp_path / 'extra.pth')
    with pytest.raises(OfficialCheckpointError) as error:
        convert_official_checkpoint(str(tmp_path / 'extra.pth'))
    assert f"extra.pth: key '{key}'" in str(error.value)
    assert 'has no counterpart in KCLAResNet-50' in str(error.value)


def test_plain_resnet_weights_load_with_only_kcla_keys_missing(tmp_path):
    resnet = ResNet(depth=50)
    resnet.init_weights()
    state = resnet.state_dict()
    # torchvision's file also has the classifier
    state['fc.weight'] = torch.zeros(1000, 2048)
    state['fc.bias'] = torch.zeros(1000)
    torch.save(state, tmp_path / 'resnet50.pth')
    model = KCLAResNet(
        depth=50,
        init_cfg=dict(
            type='Pretrained', checkpoint=str(tmp_path / 'resnet50.pth')))
    model.init_weights()
    ours = model.state_dict()
    missing = set(ours) - set(state)
    assert missing and all('.kcla.' in k for k in missing)
    for key, value in resnet.state_dict().items():
        assert torch.equal(ours[key], value), key
    # The KCLA layers still got their own initialisation.
    assert model.layer2[0].kcla.state_adapt.weight.std() > 0


def test_pretrained_with_prefix_from_a_detector_checkpoint(tmp_path):
    source = KCLAResNet(depth=18, head_dim=32)
    source.init_weights()
    torch.save(
        {
            'state_dict': {
                f'backbone.{k}': v
                for k, v in source.state_dict().items()
            },
            'meta': {
                'note': 'detector'
            }
        }, tmp_path / 'det.pth')
    model = KCLAResNet(
        depth=18,
        head_dim=32,
        init_cfg=dict(
            type='Pretrained',
            checkpoint=str(tmp_path / 'det.pth'),
            prefix='backbone.'))
    model.init_weights()
    for key, value in source.state_dict().items():
        assert torch.equal(model.state_dict()[key], value), key


def save_official_cifar(model, path, prefixed):
    """The layout of the official cifar.py: DataParallel keys (or not),
    accuracy and optimizer."""
    prefix = 'module.' if prefixed else ''
    torch.save(
        dict(
            epoch=300,
            state_dict={
                f'{prefix}{k}': v
                for k, v in model.state_dict().items()
            },
            acc=70.0,
            best_acc=70.5,
            optimizer=torch.optim.SGD(model.parameters(),
                                      lr=0.1).state_dict()), path)


# The official CIFAR model builds these in stage 1 block 0, whose forward
# never uses them (no incoming state): 643 parameters.
CIFAR_UNUSED = {
    f'stages.0.0.kcla.{k}'
    for k in ('adjust_channel.weight', 'u_Wk.weight', 'u_bn.weight',
              'u_bn.bias', 'u_bn.running_mean', 'u_bn.running_var',
              'u_bn.num_batches_tracked')
}


@pytest.mark.parametrize('prefixed', [True, False])
def test_converted_official_cifar_checkpoint_gives_the_same_features(
        prefixed, tmp_path, repo_root):
    official = randomise_(OfficialKCLACIFAR(56, num_classes=100)).eval()
    save_official_cifar(official, tmp_path / 'official.pth.tar', prefixed)
    result = convert(repo_root, tmp_path / 'official.pth.tar',
                     tmp_path / 'kcla.pth')
    assert result.returncode == 0, result.stderr
    assert 'KCLAResNetCIFAR-56 (Bottleneck) backbone' in result.stdout
    assert dropped_keys(result) == CIFAR_UNUSED | {'fc.weight', 'fc.bias'}
    model = KCLAResNetCIFAR(
        depth=56,
        out_indices=(0, 1, 2),
        init_cfg=dict(
            type='Pretrained', checkpoint=str(tmp_path / 'kcla.pth')))
    model.init_weights()
    model.eval()
    x = torch.rand(2, 3, 32, 32)
    with torch.no_grad():
        want = official.features(x)
        got = model(x)
    for a, b in zip(got, want):
        assert (a - b).abs().max() <= 1e-4 * b.abs().max()


def test_converter_names_a_cifar_checkpoint_with_uneven_stages(tmp_path):
    state = OfficialKCLACIFAR(20).state_dict()
    state = {k: v for k, v in state.items() if not k.startswith('stages.2.1.')}
    torch.save({'state_dict': state}, tmp_path / 'cut.pth')
    result = convert(ROOT, tmp_path / 'cut.pth', tmp_path / 'o.pth')
    assert result.returncode == 1
    assert 'cut.pth: blocks per stage' in result.stderr
    assert 'three equal stages' in result.stderr


def test_converter_creates_the_output_folder(tmp_path):
    """The documented command writes into checkpoints/, which need not
    exist yet (torch.save does not create it)."""
    official = randomise_(OfficialKCLACIFAR(20)).eval()
    save_official_cifar(official, tmp_path / 'official.pth.tar', True)
    out = tmp_path / 'checkpoints' / 'cifar' / 'kcla.pth'
    result = convert(ROOT, tmp_path / 'official.pth.tar', out)
    assert result.returncode == 0, result.stderr
    assert f'backbone checkpoint: {out}' in result.stdout
    ckpt = torch.load(out, weights_only=True)
    KCLAResNetCIFAR(depth=20).load_state_dict(ckpt['state_dict'], strict=True)


def build_classifier(config, **options):
    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    from mmpretrain.registry import MODELS
    cfg = Config.fromfile(osp.join(ROOT, config))
    cfg.merge_from_dict(options)
    init_default_scope('mmpretrain')
    return MODELS.build(cfg.model)


@requires_mmpretrain
@pytest.mark.parametrize('case', ['r50', 'r101', 'r56-c100', 'r56-c10'])
def test_with_head_gives_a_classifier_with_the_official_logits(
        case, tmp_path, repo_root):
    from mmengine.runner import load_checkpoint
    if case.startswith('r56'):
        classes = 100 if case == 'r56-c100' else 10
        official = randomise_(OfficialKCLACIFAR(56, classes)).eval()
        save_official_cifar(official, tmp_path / 'official.pth', True)
        x = torch.rand(2, 3, 32, 32)
        config = f'configs/kcla/kcla-r56_1xb128_cifar{classes}.py'
    else:
        official = randomise_(OfficialKCLAResNet(int(case[1:]))).eval()
        save_official(official, tmp_path / 'official.pth')
        # Small images keep R101 cheap; the pooling is global either way.
        x = torch.rand(1, 3, 96, 64)
        config = f'configs/kcla/kcla-{case}_8xb32_in1k.py'
    result = convert(repo_root, tmp_path / 'official.pth',
                     tmp_path / 'cls.pth', '--with-head')
    assert result.returncode == 0, result.stderr
    assert f'its config: {config}' in result.stdout
    assert 'fc.weight' not in dropped_keys(result)
    ckpt = torch.load(tmp_path / 'cls.pth', weights_only=True)
    assert ckpt['meta']['config'] == config
    model = build_classifier(config)
    load_checkpoint(model, str(tmp_path / 'cls.pth'), strict=True)
    model.eval()
    with torch.no_grad():
        want = official(x)
        got = model(x, mode='tensor')
    assert got.shape == want.shape
    assert (got - want).abs().max() <= 1e-4 * want.abs().max()


@requires_mmpretrain
def test_classifier_checkpoint_starts_detection_and_segmentation(tmp_path):
    """A checkpoint as mmpretrain training saves it (mmengine's
    save_checkpoint of the classifier) is what the detection and
    segmentation configs start from, through the Pretrained init_cfg with
    prefix='backbone.': every backbone key found, none left over."""
    from mmengine.config import Config
    from mmengine.registry import MODELS, init_default_scope
    from mmengine.runner.checkpoint import (_load_checkpoint_with_prefix,
                                            save_checkpoint)
    cases = [
        ('configs/kcla/faster-rcnn_kcla-r50_fpn_1x_coco.py', {}),
        ('configs/kcla/unet_kcla-r18_kvasir-seg-256x256.py',
         dict(depth=18, base_channels=32, head_dim=16)),
    ]
    for config, backbone in cases:
        options = {f'model.backbone.{k}': v for k, v in backbone.items()}
        if backbone:
            options['model.head.in_channels'] = 256
        classifier = build_classifier('configs/kcla/kcla-r50_8xb32_in1k.py',
                                      **options)
        classifier.init_weights()
        path = str(tmp_path / f'classifier_{len(backbone)}.pth')
        save_checkpoint(
            dict(
                state_dict=classifier.state_dict(),
                meta=dict(epoch=100),
                optimizer=torch.optim.SGD(classifier.parameters(),
                                          lr=0.1).state_dict()), path)
        cfg = Config.fromfile(osp.join(ROOT, config))
        cfg.model.backbone.init_cfg = dict(
            type='Pretrained', checkpoint=path, prefix='backbone.')
        init_default_scope(cfg.default_scope)
        model = MODELS.build(cfg.model)
        expected = model.backbone.state_dict()
        found = _load_checkpoint_with_prefix('backbone.', path)
        assert set(found) == set(expected), config  # no missing/unexpected
        model.backbone.init_weights()
        loaded = model.backbone.state_dict()
        source = classifier.backbone.state_dict()
        for key, value in source.items():
            assert torch.equal(loaded[key], value), (config, key)
