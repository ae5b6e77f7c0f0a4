"""Official checkpoint conversion and Pretrained init_cfg paths."""
import sys

import pytest
import torch
from mmdet.models.backbones import ResNet

from kcla_mm.models import KCLAResNet
from kcla_mm.models.official_checkpoint import official_to_mm_key
from helpers import run
from official_reference import OfficialKCLAResNet, randomise_


def convert(repo_root, src, dst):
    return run(
        sys.executable,
        'tools/model_converters/kcla_official2mm.py',
        src,
        dst,
        check=False)


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


def test_converter_rejects_other_files(tmp_path, repo_root):
    (tmp_path / 'notes.txt').write_text('not a checkpoint')
    result = convert(repo_root, tmp_path / 'notes.txt', tmp_path / 'o.pth')
    assert result.returncode == 1
    assert 'notes.txt is not a loadable torch checkpoint' in result.stderr

    torch.save({'state_dict': ResNet(depth=50).state_dict()},
               tmp_path / 'resnet.pth')
    result = convert(repo_root, tmp_path / 'resnet.pth', tmp_path / 'o.pth')
    assert result.returncode == 1
    assert "no 'layer1.attention.*' keys" in result.stderr
    assert not (tmp_path / 'o.pth').exists()

    result = convert(repo_root, tmp_path / 'missing.pth', tmp_path / 'o.pth')
    assert result.returncode == 1 and 'no such file' in result.stderr


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
