"""The classification configs (MMPretrain): models, the official recipes,
the data layouts they read, and training/testing them with every launcher
(the project's tools, mmpretrain's tools, mim, two gloo processes, the
Slurm script)."""
import functools
import glob
import os
import os.path as osp
import pickle
import re
import sys

import numpy as np
import pytest
import torch
import yaml

from helpers import ROOT, free_port, load_tool, output_of, requires_mmpretrain

pytestmark = requires_mmpretrain

KCLA = {
    'r50': 'configs/kcla/kcla-r50_8xb32_in1k.py',
    'r101': 'configs/kcla/kcla-r101_8xb32_in1k.py',
    'r56-c100': 'configs/kcla/kcla-r56_1xb128_cifar100.py',
    'r56-c10': 'configs/kcla/kcla-r56_1xb128_cifar10.py',
}
PLAIN = {
    'r50': 'configs/baselines/r50_8xb32_in1k.py',
    'r101': 'configs/baselines/r101_8xb32_in1k.py',
    'r56-c100': 'configs/baselines/r56_1xb128_cifar100.py',
    'r56-c10': 'configs/baselines/r56_1xb128_cifar10.py',
}
# The official models' used trainable parameters (../shared/reference,
# measured on github bgx666/KCLA; the never-used ones subtracted), and
# torchvision's ResNet-50/101.
OFFICIAL_KCLA = {'r50': 25_850_133, 'r101': 45_040_324, 'r56-c100': 650_042}
TORCHVISION = {'r50': 25_557_032, 'r101': 44_549_160}
MIM = osp.join(osp.dirname(sys.executable), 'mim')
# One OpenMP thread per process: these models are tiny, and on a shared
# 2-core machine the spinning threads of concurrent processes slow them
# down many times over.
ONE_THREAD = dict(os.environ, OMP_NUM_THREADS='1')


@pytest.fixture
def one_thread():
    """In-process runs with one thread (see ONE_THREAD); conftest.py puts
    the count back after the test."""
    torch.set_num_threads(1)


def build(config, **options):
    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    from mmpretrain.registry import MODELS
    cfg = Config.fromfile(osp.join(ROOT, config))
    cfg.merge_from_dict(options)
    init_default_scope('mmpretrain')
    return cfg, MODELS.build(cfg.model)


@functools.lru_cache(maxsize=None)
def parameters(config):
    """``{name: (shape, trainable)}`` of the config's classifier and the
    backbone's norm_eval, built once per module (R101 takes seconds)."""
    _, model = build(config)
    return ({
        n: (tuple(p.shape), p.requires_grad)
        for n, p in model.named_parameters()
    }, model.backbone.norm_eval)


def count(config, keep=lambda name: True):
    """Trainable parameters of the config's classifier."""
    return sum(
        int(np.prod(shape))
        for n, (shape, trainable) in parameters(config)[0].items()
        if trainable and keep(n))


def metafile_entries():
    """The model-zoo entries of the classification configs, by config."""
    entries = {}
    for folder in ('kcla', 'baselines'):
        with open(osp.join(ROOT, 'configs', folder, 'metafile.yml')) as f:
            for entry in yaml.safe_load(f)['Models']:
                if entry['Metadata']['Task'] == 'Image Classification':
                    entries[entry['Config']] = entry
    return entries


@pytest.mark.parametrize('config', sorted({**KCLA, **PLAIN}.values()))
def test_classifier_has_the_documented_parameters(config):
    """Every classification config builds, with the metafile's (and the
    README's) parameter count; the KCLA ones with the official models'
    used trainable parameters, the ImageNet baselines with torchvision's."""
    entry = metafile_entries()[config]
    assert count(config) == entry['Metadata']['Parameters']
    name = {v: k for k, v in {**KCLA, **PLAIN}.items()}[config]
    if config in KCLA.values() and name in OFFICIAL_KCLA:
        assert count(config) == OFFICIAL_KCLA[name]
    if config in PLAIN.values() and name in TORCHVISION:
        assert count(config) == TORCHVISION[name]
    epochs = 100 if 'in1k' in config else 300
    assert entry['Metadata']['Epochs'] == epochs
    assert 'Results' not in entry and 'Weights' not in entry


@pytest.mark.parametrize('config', [KCLA['r56-c100'], PLAIN['r56-c10']])
def test_metafile_flops_are_get_flops_measurements(config, one_thread):
    """The CIFAR entries' FLOPs are what tools/analysis/get_flops.py counts
    (kcla_mm.analysis.flops) at the config's own 32x32 input (the ImageNet
    entries are counted the same way at 224x224; too slow for a test)."""
    from mmengine.config import Config

    from kcla_mm.analysis.flops import analyse_config
    entry = metafile_entries()[config]
    result = analyse_config(Config.fromfile(osp.join(ROOT, config)))
    assert result['shape'] == (32, 32)
    assert entry['Metadata']['FLOPs Input Shape'] == '1x3x32x32'
    assert result['flops'] == entry['Metadata']['FLOPs']
    assert result['params'] == entry['Metadata']['Parameters']


@pytest.mark.parametrize('name', sorted(KCLA))
def test_baseline_is_the_kcla_classifier_without_its_kcla_layers(name):
    """Same recipe, same network but for the layer attention: the plain
    classifier has exactly the KCLA classifier's non-KCLA parameters, under
    the same names."""
    from mmengine.config import Config
    kcla_params, kcla_norm_eval = parameters(KCLA[name])
    plain_params, plain_norm_eval = parameters(PLAIN[name])
    assert plain_params == {
        n: p
        for n, p in kcla_params.items() if '.kcla.' not in n
    }
    kcla_cfg = Config.fromfile(osp.join(ROOT, KCLA[name]))
    plain_cfg = Config.fromfile(osp.join(ROOT, PLAIN[name]))
    for key in ('optim_wrapper', 'param_scheduler', 'train_cfg',
                'train_dataloader', 'val_dataloader', 'test_dataloader',
                'data_preprocessor', 'auto_scale_lr'):
        assert plain_cfg[key] == kcla_cfg[key], key
    for key in ('neck', 'head'):
        assert plain_cfg.model[key] == kcla_cfg.model[key], key
    # Classifiers train their BN statistics (mmdet's ResNet freezes them).
    assert plain_norm_eval is False and kcla_norm_eval is False


def official_imagenet_lr(epoch, lr=0.1, warmup_epochs=3, warmup_lr=1e-4):
    """step_lr() of github bgx666/KCLA imagenet/train.py, re-typed."""
    if warmup_epochs and epoch < warmup_epochs:
        return warmup_lr if epoch == 0 else lr * epoch / warmup_epochs
    if epoch >= 90:
        return lr * 1e-3
    if epoch >= 70:
        return lr * 1e-2
    if epoch >= 40:
        return lr * 1e-1
    return lr


def official_cifar_lr(epoch, lr=0.1, schedule=(150, 225), gamma=0.1):
    """cifar/cifar.py: lr *= gamma when an epoch in the schedule starts."""
    for milestone in schedule:
        if epoch >= milestone:
            lr *= gamma
    return lr


def lr_per_epoch(config):
    """The lr of every epoch, from the schedulers the config builds,
    stepped once per epoch as mmengine's ParamSchedulerHook does."""
    from mmengine.config import Config
    from mmengine.optim import build_optim_wrapper
    from mmengine.registry import PARAM_SCHEDULERS, init_default_scope
    cfg = Config.fromfile(osp.join(ROOT, config))
    init_default_scope('mmpretrain')
    wrapper = build_optim_wrapper(torch.nn.Linear(1, 1), cfg.optim_wrapper)
    schedulers = cfg.param_scheduler
    if isinstance(schedulers, dict):
        schedulers = [schedulers]
    schedulers = [
        PARAM_SCHEDULERS.build(
            dict(s, optimizer=wrapper.optimizer, epoch_length=1))
        for s in schedulers
    ]
    lrs = []
    for _ in range(cfg.train_cfg.max_epochs):
        lrs.append(wrapper.optimizer.param_groups[0]['lr'])
        wrapper.optimizer.step()
        for scheduler in schedulers:
            scheduler.step()
    return cfg, lrs


@pytest.mark.filterwarnings('ignore:Detected call of')
def test_imagenet_recipe_is_the_official_one():
    cfg, lrs = lr_per_epoch(KCLA['r50'])
    assert len(lrs) == 100
    np.testing.assert_allclose(
        lrs, [official_imagenet_lr(e) for e in range(100)], rtol=1e-9)
    optimizer = cfg.optim_wrapper.optimizer
    assert (optimizer.type, optimizer.momentum,
            optimizer.weight_decay) == ('SGD', 0.9, 1e-4)
    assert cfg.train_dataloader.batch_size * 8 == 256
    assert cfg.auto_scale_lr.base_batch_size == 256
    assert cfg.model.backbone.kcla_drop_path == 0.2
    train = [t['type'] for t in cfg.train_dataloader.dataset.pipeline]
    assert train == [
        'LoadImageFromFile', 'RandomResizedCrop', 'RandomFlip', 'PackInputs'
    ]
    assert cfg.train_dataloader.dataset.pipeline[1].scale == 224
    val = cfg.val_dataloader.dataset.pipeline
    assert (val[1].type, val[1].scale, val[1].edge) == ('ResizeEdge', 256,
                                                        'short')
    assert (val[2].type, val[2].crop_size) == ('CenterCrop', 224)
    assert cfg.model.head.loss.type == 'CrossEntropyLoss'
    assert 'label_smooth_val' not in cfg.model.head.loss


@pytest.mark.filterwarnings('ignore:Detected call of')
@pytest.mark.parametrize('name', ['r56-c100', 'r56-c10'])
def test_cifar_recipe_is_the_official_one(name):
    cfg, lrs = lr_per_epoch(KCLA[name])
    assert len(lrs) == 300
    np.testing.assert_allclose(
        lrs, [official_cifar_lr(e) for e in range(300)], rtol=1e-9)
    optimizer = cfg.optim_wrapper.optimizer
    assert (optimizer.momentum, optimizer.weight_decay) == (0.9, 5e-4)
    assert cfg.train_dataloader.batch_size == 128
    crop = cfg.train_dataloader.dataset.pipeline[0]
    assert (crop.type, crop.crop_size, crop.padding) == ('RandomCrop', 32, 4)
    # The official normalisation, (0.4914, 0.4822, 0.4465) and
    # (0.2023, 0.1994, 0.2010), in 0-255.
    np.testing.assert_allclose(cfg.data_preprocessor.mean,
                               np.array([0.4914, 0.4822, 0.4465]) * 255)
    np.testing.assert_allclose(cfg.data_preprocessor.std,
                               np.array([0.2023, 0.1994, 0.2010]) * 255)
    classes = 100 if name == 'r56-c100' else 10
    assert cfg.model.head.num_classes == classes
    assert cfg.train_dataloader.dataset.download is False


def write_imagenet(root, classes=3, per_class=(6, 3), size=(40, 48)):
    """The official script's layout (torchvision ImageFolder):
    split/<wnid>/*.JPEG; class c's images are brighter with c."""
    import cv2
    rng = np.random.default_rng(0)
    for split, n in zip(('train', 'val'), per_class):
        for c in range(classes):
            folder = osp.join(root, split, f'n{c:08d}')
            os.makedirs(folder, exist_ok=True)
            for i in range(n):
                img = np.full((*size, 3), 50 + 70 * c, np.uint8)
                img += rng.integers(0, 20, img.shape, dtype=np.uint8)
                cv2.imwrite(osp.join(folder, f'{split}_{c}_{i}.JPEG'), img)
    return root


@pytest.fixture(scope='module')
def imagenet_root(tmp_path_factory):
    return str(write_imagenet(str(tmp_path_factory.mktemp('imagenet'))))


def load(config):
    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    init_default_scope('mmpretrain')
    return Config.fromfile(osp.join(ROOT, config))


def imagenet_dataset(data_root, split, **extra):
    from mmpretrain.registry import DATASETS
    cfg = load(KCLA['r50'])
    loader = cfg.train_dataloader if split == 'train' else cfg.val_dataloader
    return DATASETS.build(
        dict(
            loader.dataset,
            data_root=data_root,
            classes=['a', 'b', 'c'],
            **extra))


@pytest.mark.parametrize('split', ['train', 'val'])
def test_imagenet_config_reads_the_official_class_folder_layout(
        imagenet_root, split):
    dataset = imagenet_dataset(imagenet_root, split)
    per_class = 6 if split == 'train' else 3
    assert len(dataset) == 3 * per_class
    for i in range(len(dataset)):
        info = dataset.get_data_info(i)
        # The folder of sorted wnids gives the label, as ImageFolder does.
        wnid = osp.basename(osp.dirname(info['img_path']))
        assert info['gt_label'] == int(wnid[1:])
    # RandomResizedCrop 224 / ResizeEdge 256 + CenterCrop 224.
    assert tuple(dataset[0]['inputs'].shape) == (3, 224, 224)


@pytest.mark.parametrize('split', ['train', 'val'])
def test_imagenet_config_reads_mmpretrain_annotation_files(tmp_path, split):
    """mmpretrain's layout: meta/<split>.txt lines ``<path under split/>
    <label>``; the labels come from the file, not from folders."""
    import cv2
    os.makedirs(tmp_path / 'meta')
    labels = [2, 0, 1, 1]
    lines = []
    for i, label in enumerate(labels):
        # A folder name that is no class: only the file can give the label.
        folder = tmp_path / split / f'n{i % 2:08d}'
        os.makedirs(folder, exist_ok=True)
        cv2.imwrite(
            str(folder / f'img_{i}.JPEG'), np.full((30, 30, 3), 100, np.uint8))
        lines.append(f'n{i % 2:08d}/img_{i}.JPEG {label}\n')
    (tmp_path / 'meta' / f'{split}.txt').write_text(''.join(lines))
    dataset = imagenet_dataset(str(tmp_path), split)
    assert [dataset.get_data_info(i)['gt_label']
            for i in range(len(dataset))] == labels
    assert osp.basename(dataset.get_data_info(3)['img_path']) == 'img_3.JPEG'
    assert tuple(dataset[0]['inputs'].shape) == (3, 224, 224)


def write_cifar100(root, train=20, test=10):
    """The extracted official python archive: cifar-100-python/{train,
    test,meta}, pickles of uint8 rows (3x32x32, channel-major) and
    fine_labels."""
    rng = np.random.default_rng(0)
    folder = osp.join(root, 'cifar-100-python')
    os.makedirs(folder)
    labels = {}
    for name, n in (('train', train), ('test', test)):
        labels[name] = [int(v) for v in rng.integers(0, 100, n)]
        data = rng.integers(0, 256, (n, 3 * 32 * 32), dtype=np.uint8)
        with open(osp.join(folder, name), 'wb') as f:
            pickle.dump(dict(data=data, fine_labels=labels[name]), f)
    with open(osp.join(folder, 'meta'), 'wb') as f:
        pickle.dump(dict(fine_label_names=[f'c{i}' for i in range(100)]), f)
    return labels


def lift_cifar100_md5_check(monkeypatch):
    """mmpretrain's CIFAR100 checks the md5 of the real archive's files;
    a generated archive cannot match them, so the tests that read one (and
    only they, in this process) set those md5 entries to None, which
    mmpretrain reads as "check that the file exists". Everything else is
    the config's dataset as it is."""
    from mmpretrain.datasets import CIFAR100
    for attr in ('train_list', 'test_list'):
        monkeypatch.setattr(CIFAR100, attr,
                            [[name, None]
                             for name, _ in getattr(CIFAR100, attr)])


def test_cifar100_config_reads_the_official_python_archive(
        tmp_path, monkeypatch):
    from mmpretrain.registry import DATASETS
    cfg = load(KCLA['r56-c100'])
    with pytest.raises(RuntimeError, match='Cannot find CIFAR100 dataset'):
        DATASETS.build(
            dict(cfg.train_dataloader.dataset, data_root=str(tmp_path)))
    labels = write_cifar100(str(tmp_path))
    lift_cifar100_md5_check(monkeypatch)
    for loader, split in ((cfg.train_dataloader, 'train'), (cfg.val_dataloader,
                                                            'test')):
        dataset = DATASETS.build(dict(loader.dataset, data_root=str(tmp_path)))
        assert [
            dataset.get_data_info(i)['gt_label'] for i in range(len(dataset))
        ] == labels[split]
        assert tuple(dataset[0]['inputs'].shape) == (3, 32, 32)


def cifar_options(data_root, epochs, name):
    """The CIFAR-100 config on the generated archive (20 train / 10 test
    images): depth 11 (one Bottleneck per stage), 2 steps per epoch, the
    x0.1 milestone at epoch 1 instead of 150, and the scheduler's end
    given (mmengine defaults it to the run's max_epochs, and a resumed run
    keeps the checkpoint's: a 1-epoch first run would end the schedule
    before its milestone). Deterministic, so that a resumed run can be
    compared with an uninterrupted one: a fixed seed (the sampler's order
    per epoch), no drop path (it would draw from the main process's RNG,
    whose state a checkpoint does not hold), and data workers started
    afresh each epoch (mmengine seeds them the same each time)."""
    opts = [
        f'data_root={data_root}', 'model.backbone.depth=11',
        'model.backbone.kcla_drop_path=0.0', f'train_cfg.max_epochs={epochs}',
        'param_scheduler.milestones=[1]', 'param_scheduler.end=2',
        'randomness.seed=0', f'experiment_name={name}',
        'default_hooks.logger.interval=1', 'train_dataloader.batch_size=10',
        'train_dataloader.num_workers=1',
        'train_dataloader.persistent_workers=False'
    ]
    for loader in ('val', 'test'):
        opts += [
            f'{loader}_dataloader.batch_size=5',
            f'{loader}_dataloader.num_workers=0',
            f'{loader}_dataloader.persistent_workers=False'
        ]
    return opts


def last_log(work_dir):
    """The log of the latest run in ``work_dir`` (mmengine writes
    <timestamp>/<timestamp>.log)."""
    logs = sorted(glob.glob(osp.join(work_dir, '*', '*.log')))
    assert logs, work_dir
    with open(logs[-1]) as f:
        return f.read()


def test_project_tools_resume_the_cifar_recipe_exactly(tmp_path, monkeypatch,
                                                       one_thread):
    """tools/train.py on the CIFAR-100 config: 2 epochs straight, and 1
    epoch then ``--resume`` to 2, give the same epoch-2 checkpoint, which
    needs the epoch counter, the weights, the SGD momentum buffers and the
    scheduler state (lr x0.1 from epoch 1) all restored. Then tools/test.py
    with --out and --show-dir. In this process, for the md5 check (see
    lift_cifar100_md5_check)."""
    labels = write_cifar100(str(tmp_path / 'cifar100'))
    lift_cifar100_md5_check(monkeypatch)
    root = str(tmp_path / 'cifar100')
    train = load_tool('tools/train.py').main
    straight, stopped = str(tmp_path / 'straight'), str(tmp_path / 'stopped')
    config = KCLA['r56-c100']
    train([
        config, '--work-dir', straight, '--cfg-options',
        *cifar_options(root, 2, 'straight')
    ])
    train([
        config, '--work-dir', stopped, '--cfg-options',
        *cifar_options(root, 1, 'stopped')
    ])
    assert not osp.exists(osp.join(stopped, 'epoch_2.pth'))
    train([
        config, '--work-dir', stopped, '--resume', '--cfg-options',
        *cifar_options(root, 2, 'resumed')
    ])
    log = last_log(stopped)
    assert 'resumed epoch: 1, iter: 2' in log
    assert 'Epoch(train) [1]' not in log
    assert re.search(r'Epoch\(train\) \[2\]\[2/2\]\s+lr: 1\.0000e-02', log)

    def checkpoint(work_dir):
        # This test's own files (torch 2.1 cannot allow-list mmengine's log
        # types for weights_only: README, "Loading checkpoints").
        return torch.load(
            osp.join(work_dir, 'epoch_2.pth'),
            map_location='cpu',
            weights_only=False)

    a, b = checkpoint(straight), checkpoint(stopped)
    assert (b['meta']['epoch'], b['meta']['iter']) == (2, 4)
    assert a['state_dict'].keys() == b['state_dict'].keys()
    for key, value in a['state_dict'].items():
        torch.testing.assert_close(b['state_dict'][key], value, msg=key)
    momentum = {
        i: s['momentum_buffer']
        for i, s in a['optimizer']['state'].items()
    }
    assert len(momentum) > 50
    for i, buffer in momentum.items():
        torch.testing.assert_close(
            b['optimizer']['state'][i]['momentum_buffer'], buffer)
    assert b['param_schedulers'] == a['param_schedulers']
    assert b['optimizer']['param_groups'][0]['lr'] == pytest.approx(0.01)

    # tools/test.py: the metric, the raw predictions in the test set's
    # order with its labels, and the drawn images.
    out = str(tmp_path / 'preds.pkl')
    load_tool('tools/test.py').main([
        config,
        osp.join(stopped, 'epoch_2.pth'), '--work-dir',
        str(tmp_path / 'test'), '--out', out, '--show-dir', 'vis',
        '--cfg-options', *cifar_options(root, 2, 'test')
    ])
    assert re.search(r'accuracy/top1: [\d.]+', last_log(tmp_path / 'test'))
    with open(out, 'rb') as f:
        predictions = pickle.load(f)
    assert [int(p['gt_label'][0]) for p in predictions] == labels['test']
    assert all(p['pred_score'].shape == (100, ) for p in predictions)
    drawn = glob.glob(str(tmp_path / 'test' / 'vis' / '*.png'))
    assert len(drawn) == len(labels['test'])


# --cfg-options that shrink the ImageNet config to the generated set.
def tiny_options(data_root, epochs=1, workers=1, kcla=True):
    opts = [
        'model.backbone.depth=18', 'model.backbone.base_channels=16',
        'model.head.in_channels=128'
    ] + (['model.backbone.head_dim=16'] if kcla else []) + [
        'model.head.num_classes=3', 'model.head.topk=[1]',
        'data_preprocessor.num_classes=3', f'train_cfg.max_epochs={epochs}',
        'default_hooks.logger.interval=1', 'train_dataloader.batch_size=6',
        'train_dataloader.dataset.pipeline.1.scale=32',
        'val_evaluator.topk=[1]', 'test_evaluator.topk=[1]'
    ]
    for loader in ('train', 'val', 'test'):
        opts += [
            f'{loader}_dataloader.dataset.data_root={data_root}',
            f'{loader}_dataloader.dataset.classes=[a,b,c]',
            f'{loader}_dataloader.num_workers={workers}'
        ]
        if loader != 'train':
            opts += [
                f'{loader}_dataloader.batch_size=3',
                f'{loader}_dataloader.dataset.pipeline.1.scale=36',
                f'{loader}_dataloader.dataset.pipeline.2.crop_size=32'
            ]
    return opts


def top1(log):
    found = re.findall(r'accuracy/top1: ([\d.]+)', log)
    assert found, log[-3000:]
    return float(found[-1])


def mmpretrain_tool(name):
    import mmpretrain
    path = osp.join(osp.dirname(mmpretrain.__file__), '.mim', 'tools', name)
    assert osp.isfile(path), path
    return path


def kcla_r50_tool(script, *args, data_root, epochs=1):
    """The output of ``python SCRIPT KCLA-R50-config *ARGS`` with the config
    shrunk to the generated set (:func:`tiny_options`), on one thread."""
    return output_of(
        sys.executable,
        script,
        KCLA['r50'],
        *args,
        '--cfg-options',
        *tiny_options(data_root, epochs=epochs),
        env=ONE_THREAD)


def test_project_tools_train_resume_and_test(imagenet_root, tmp_path):
    work = str(tmp_path / 'work')
    log = kcla_r50_tool(
        'tools/train.py', '--work-dir', work, data_root=imagenet_root)
    assert osp.isfile(osp.join(work, 'epoch_1.pth'))
    assert 'Epoch(train) [1][3/3]' in log
    # Resume: epoch 2 continues from epoch 1's checkpoint, at the official
    # warm-up lr of epoch 1 (0.1 / 3), not from scratch.
    log = kcla_r50_tool(
        'tools/train.py',
        '--work-dir',
        work,
        '--resume',
        data_root=imagenet_root,
        epochs=2)
    assert 'resumed epoch: 1, iter: 3' in log
    assert 'Epoch(train) [1]' not in log
    assert re.search(r'Epoch\(train\) \[2\]\[1/3\]\s+lr: 3\.3333e-02', log)
    # This test's own file; torch 2.1 cannot allow-list mmengine's log
    # types for weights_only (README, "Loading checkpoints").
    ckpt = torch.load(
        osp.join(work, 'epoch_2.pth'), map_location='cpu', weights_only=False)
    assert ckpt['meta']['epoch'] == 2
    assert any(
        k.startswith('backbone.layer1.0.kcla.') for k in ckpt['state_dict'])
    log = kcla_r50_tool(
        'tools/test.py',
        osp.join(work, 'epoch_2.pth'),
        '--work-dir',
        work,
        data_root=imagenet_root)
    assert 0 <= top1(log) <= 100


def test_mmpretrain_own_tools(imagenet_root, tmp_path):
    """mmpretrain's tools/train.py and tools/test.py (shipped in its .mim)
    with a KCLA config: its custom_imports register the backbone."""
    work = str(tmp_path / 'work')
    log = kcla_r50_tool(
        mmpretrain_tool('train.py'),
        '--work-dir',
        work,
        data_root=imagenet_root)
    assert 'Epoch(train) [1][3/3]' in log
    log = kcla_r50_tool(
        mmpretrain_tool('test.py'),
        osp.join(work, 'epoch_1.pth'),
        '--work-dir',
        work,
        data_root=imagenet_root)
    assert 0 <= top1(log) <= 100


def test_mim_train_and_test(imagenet_root, tmp_path):
    """``mim train/test mmpretrain`` find mmpretrain's tools in its .mim
    (mim runs the installed package's tools/train.py) and take a config
    path outside mmpretrain, whose custom_imports register KCLA."""
    env = dict(
        ONE_THREAD,
        PATH=osp.dirname(sys.executable) + os.pathsep + os.environ['PATH'])
    work = str(tmp_path / 'work')
    options = tiny_options(imagenet_root)
    log = output_of(
        MIM,
        'train',
        'mmpretrain',
        KCLA['r50'],
        '--work-dir',
        work,
        '--cfg-options',
        *options,
        env=env)
    assert f'Training command is {sys.executable} ' \
        f"{mmpretrain_tool('train.py')} {KCLA['r50']}" in log
    assert 'Epoch(train) [1][3/3]' in log
    assert "type='KCLAResNet'" in log
    log = output_of(
        MIM,
        'test',
        'mmpretrain',
        KCLA['r50'],
        '--checkpoint',
        osp.join(work, 'epoch_1.pth'),
        '--work-dir',
        work,
        '--cfg-options',
        *options,
        env=env)
    assert 0 <= top1(log) <= 100


def test_dist_train_two_gloo_processes(imagenet_root, tmp_path):
    env = dict(ONE_THREAD, PORT=str(free_port()), PYTHON=sys.executable)
    log = output_of(
        'bash',
        'tools/dist_train.sh',
        KCLA['r50'],
        '2',
        '--work-dir',
        str(tmp_path),
        '--cfg-options',
        *tiny_options(imagenet_root, workers=0),
        'train_dataloader.batch_size=3',
        env=env)
    assert "dist_cfg: {'backend': 'gloo'}" in log
    # mmengine's wording for the world size
    assert 'Distributed training: True' in log and 'GPU number: 2' in log
    # 18 images, 3 per process and step: 3 steps per epoch on each rank.
    assert 'Epoch(train) [1][3/3]' in log
    assert osp.isfile(tmp_path / 'epoch_1.pth')


def test_slurm_train_builds_the_srun_command(tmp_path):
    """No Slurm here: a stand-in ``srun`` on PATH records the command that
    slurm_train.sh hands it, which must be tools/train.py with the config,
    the work dir, the slurm launcher and the extra arguments."""
    fake = tmp_path / 'bin'
    fake.mkdir()
    (fake / 'srun').write_text('#!/bin/sh\nprintf "%s\\n" "$@" > '
                               f'{tmp_path}/srun_args\n')
    (fake / 'srun').chmod(0o755)
    env = dict(
        os.environ,
        PATH=f'{fake}{os.pathsep}{os.environ["PATH"]}',
        GPUS='16',
        GPUS_PER_NODE='8',
        PYTHON=sys.executable)
    output_of(
        'bash',
        'tools/slurm_train.sh',
        'gpu',
        'kcla-r50',
        KCLA['r50'],
        'work_dirs/kcla-r50',
        '--resume',
        env=env)
    args = (tmp_path / 'srun_args').read_text().splitlines()
    assert args[:7] == [
        '-p', 'gpu', '--job-name=kcla-r50', '--gres=gpu:8', '--ntasks=16',
        '--ntasks-per-node=8', '--cpus-per-task=5'
    ]
    assert args[-8:] == [
        sys.executable, '-u',
        osp.join(ROOT, 'tools', 'train.py'), KCLA['r50'],
        '--work-dir=work_dirs/kcla-r50', '--launcher', 'slurm', '--resume'
    ]
