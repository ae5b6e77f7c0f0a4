"""The pretraining demo (`make demo-pretrain`): the ImageNet-layout set of
tools/misc/make_synthetic_imagenet.py (layout, determinism, errors, read by
mmpretrain's datasets and torchvision's ImageFolder) and a shrunk run of
the demo that must learn (subprocesses, CPU)."""
import os
import os.path as osp
import re
import sys

import cv2
import pytest

from helpers import ROOT, load_tool, output_of, requires_mmpretrain

GENERATOR = 'tools/misc/make_synthetic_imagenet.py'
DEMO_CONFIG = 'configs/kcla/demo/kcla-r18_1xb32_synthetic-imagenet.py'


@pytest.fixture(scope='module')
def generator():
    return load_tool(GENERATOR)


def generate(generator, out, *args):
    generator.main([str(out), *map(str, args)])


def files_of(root):
    """{relative path: bytes} of every file under ``root``."""
    found = {}
    for folder, _, names in os.walk(root):
        for name in names:
            path = osp.join(folder, name)
            with open(path, 'rb') as f:
                found[osp.relpath(path, root)] = f.read()
    return found


def test_generator_writes_the_imagenet_class_folders(generator, tmp_path):
    generate(generator, tmp_path, '--classes', 3, '--train', 4, '--val', 2,
             '--size', 40, '--ann-files')
    wnids = ['n00000000', 'n00000001', 'n00000002']
    for split, per_class in (('train', 4), ('val', 2)):
        assert sorted(os.listdir(tmp_path / split)) == wnids
        for wnid in wnids:
            names = sorted(os.listdir(tmp_path / split / wnid))
            assert len(names) == per_class
            for name in names:
                img = cv2.imread(str(tmp_path / split / wnid / name))
                assert img.shape == (40, 40, 3), name
    assert sorted(os.listdir(tmp_path / 'train' / 'n00000001')) == [
        f'n00000001_{i}.JPEG' for i in range(4)
    ]
    # ImageNet's validation names, numbered from 1 across the classes.
    val_names = sorted(
        name for wnid in wnids for name in os.listdir(tmp_path / 'val' / wnid))
    assert val_names == [f'ILSVRC2012_val_{i:08d}.JPEG' for i in range(1, 7)]
    # mmpretrain's annotation lists: the class folders' files and labels.
    for split in ('train', 'val'):
        lines = (tmp_path / 'meta' / f'{split}.txt').read_text().splitlines()
        listed = [line.rsplit(' ', 1) for line in lines]
        assert sorted(path for path, _ in listed) == sorted(
            f'{wnid}/{name}' for wnid in wnids
            for name in os.listdir(tmp_path / split / wnid))
        assert all(
            int(label) == wnids.index(path.split('/')[0])
            for path, label in listed)
    classes = list(generator.CLASSES[:3])
    assert (tmp_path / 'meta' /
            'classes.txt').read_text().splitlines() == classes
    assert (tmp_path / 'meta' / 'synsets.txt').read_text().splitlines() == [
        f'{wnid} {name}' for wnid, name in zip(wnids, classes)
    ]


def test_generator_is_deterministic_for_a_seed(generator, tmp_path):
    args = ('--classes', 4, '--train', 3, '--val', 2, '--size', 32)
    generate(generator, tmp_path / 'a', *args, '--seed', 3)
    generate(generator, tmp_path / 'b', *args, '--seed', 3)
    generate(generator, tmp_path / 'c', *args, '--seed', 4)
    a, b, c = (files_of(tmp_path / x) for x in 'abc')
    assert len(a) == 4 * (3 + 2)
    assert a == b
    assert a.keys() == c.keys()
    assert all(a[path] != c[path] for path in a)


def test_generator_images_differ_within_a_class(generator):
    """Random colours, positions and sizes: within a class neither the
    object's colour nor the image's mean colour repeats."""
    import numpy as np
    rng = np.random.default_rng(0)
    for label in range(len(generator.CLASSES)):
        images = [generator.draw_image(rng, label, 48) for _ in range(8)]
        means = np.array([img.reshape(-1, 3).mean(0) for img in images])
        assert means.std(0).min() > 10, generator.CLASSES[label]


@pytest.mark.parametrize(
    'args, message',
    [(['--classes', '9'], '--classes must be between 2 and 8'),
     (['--classes', '1'], '--classes must be between 2 and 8'),
     (['--train', '0'], '--train must be at least 1, got 0'),
     (['--val', '-2'], '--val must be at least 1, got -2'),
     (['--size', '16'], '--size must be at least 32, got 16')])
def test_generator_names_the_bad_argument(generator, tmp_path, capsys, args,
                                          message):
    with pytest.raises(SystemExit):
        generate(generator, tmp_path / 'out', *args)
    assert message in capsys.readouterr().err
    assert not osp.exists(tmp_path / 'out')


def test_generator_refuses_a_folder_with_another_set(generator, tmp_path):
    args = ('--train', 2, '--val', 1, '--size', 32)
    generate(generator, tmp_path, '--classes', 3, *args)
    before = files_of(tmp_path)
    # The same set again: the same files.
    generate(generator, tmp_path, '--classes', 3, *args)
    assert files_of(tmp_path) == before
    # Fewer classes or images would leave the others in the folder scan.
    with pytest.raises(FileExistsError, match='n00000002 is not part'):
        generate(generator, tmp_path, '--classes', 2, *args)
    with pytest.raises(FileExistsError, match='n00000000_1.JPEG is not part'):
        generate(generator, tmp_path, '--classes', 3, '--train', 1, '--val', 1,
                 '--size', 32)
    assert files_of(tmp_path) == before


def data_list(dataset, split_dir):
    """(path relative to the split folder, label) of every sample."""
    return sorted(
        (osp.relpath(info['img_path'], split_dir), info['gt_label'])
        for info in (dataset.get_data_info(i) for i in range(len(dataset))))


@requires_mmpretrain
def test_demo_config_reads_the_generated_set(generator, tmp_path):
    """The demo config's ImageNet datasets, torchvision's ImageFolder and
    mmpretrain's CustomDataset give every image the label of its class
    folder; with --ann-files, ImageNet reads meta/<split>.txt instead and
    gets the same list."""
    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    from mmpretrain.registry import DATASETS
    from torchvision.datasets import ImageFolder
    cfg = Config.fromfile(osp.join(ROOT, DEMO_CONFIG))
    # The config names the generator's classes, in label order.
    assert cfg.classes == generator.CLASSES
    assert cfg.model.head.num_classes == len(generator.CLASSES)
    assert cfg.data_preprocessor.num_classes == len(generator.CLASSES)
    generate(generator, tmp_path / 'folders', '--train', 2, '--val', 1,
             '--size', 32)
    generate(generator, tmp_path / 'lists', '--train', 2, '--val', 1, '--size',
             32, '--ann-files')
    init_default_scope('mmpretrain')
    for split, loader, per_class in (('train', cfg.train_dataloader, 2),
                                     ('val', cfg.val_dataloader, 1)):
        split_dir = str(tmp_path / 'folders' / split)
        folder = ImageFolder(split_dir)
        expected = sorted((osp.relpath(path, split_dir), label)
                          for path, label in folder.samples)
        assert len(expected) == 8 * per_class
        assert all(label == int(path.split('/')[0][1:])
                   for path, label in expected)
        dataset = DATASETS.build(
            dict(loader.dataset, data_root=str(tmp_path / 'folders')))
        assert not dataset.ann_file  # scanned the class folders
        assert dataset.CLASSES == generator.CLASSES
        assert data_list(dataset, split_dir) == expected
        # The demo's 48x48 crops.
        assert tuple(dataset[0]['inputs'].shape) == (3, 48, 48)
        listed = DATASETS.build(
            dict(loader.dataset, data_root=str(tmp_path / 'lists')))
        assert listed.ann_file.endswith(osp.join('meta', f'{split}.txt'))
        assert data_list(listed, str(tmp_path / 'lists' / split)) == expected
        custom = DATASETS.build(
            dict(
                type='CustomDataset',
                data_root=str(tmp_path / 'folders'),
                data_prefix=split))
        assert custom.CLASSES == tuple(folder.classes)
        assert data_list(custom, split_dir) == expected


def top1(log):
    found = re.findall(r'accuracy/top1: ([\d.]+)', log)
    assert found, log[-3000:]
    return float(found[-1])


@requires_mmpretrain
def test_demo_learns_from_chance(tmp_path):
    """`make demo-pretrain`'s commands, shrunk (200 training and 20
    validation images a class, 8 epochs, about a minute on 2 cores): the
    untrained classifier is at chance (1/8) on the validation set, the
    trained one well above it (38.75% when this was written; the full demo
    reaches 66%)."""
    data, work = tmp_path / 'data', tmp_path / 'work'
    output_of(sys.executable, GENERATOR, data, '--train', 200, '--val', 20,
              '--size', 64, '--seed', 0)
    options = [
        '--cfg-options', f'data_root={data}', 'train_cfg.max_epochs=8',
        'param_scheduler.1.T_max=8', 'param_scheduler.1.end=8',
        'default_hooks.checkpoint.interval=8', 'train_cfg.val_interval=8'
    ]
    work.mkdir()
    initial = work / 'initial.pth'
    output_of(sys.executable, 'tools/misc/save_initial_checkpoint.py',
              DEMO_CONFIG, initial, *options)
    before = top1(
        output_of(sys.executable, 'tools/test.py', DEMO_CONFIG, initial,
                  '--work-dir', work / 'before', *options))
    output_of(sys.executable, 'tools/train.py', DEMO_CONFIG, '--work-dir',
              work, *options)
    after = top1(
        output_of(sys.executable, 'tools/test.py', DEMO_CONFIG,
                  work / 'epoch_8.pth', '--work-dir', work / 'after',
                  *options))
    # 160 images, 20 a class: an untrained network that puts (nearly)
    # everything into one or two classes scores 12.5-25%.
    assert before <= 25, before
    assert after >= 30 and after >= before + 15, (before, after)
