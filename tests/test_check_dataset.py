"""tools/misc/check_dataset.py on prepared synthetic Kvasir-SEG and COCO
sets, clean and corrupted; the medical datasets and the converters refusing
empty splits."""
import glob
import json
import os
import os.path as osp
import re
import shutil
import sys

import cv2
import numpy as np
import pytest

from helpers import load_tool, output_of, run

SEG_CONFIG = 'configs/kcla/unet_kcla-r18_kvasir-seg-256x256.py'
DET_CONFIG = 'configs/kcla/demo/faster-rcnn_kcla-r18_fpn_synthetic-coco.py'
TOOL = 'tools/misc/check_dataset.py'


@pytest.fixture(scope='module')
def tool():
    return load_tool(TOOL)


@pytest.fixture(scope='module')
def kvasir(tmp_path_factory):
    """A raw synthetic Kvasir-SEG archive (8 pairs) and its prepared set
    (train 6, val 2)."""
    base = tmp_path_factory.mktemp('kvasir')
    output_of(sys.executable, 'tools/misc/make_synthetic_medseg.py',
              '--layout', 'kvasir', base / 'raw', '--count', '8')
    output_of(sys.executable, 'tools/dataset_converters/prepare_kvasir.py',
              base / 'raw', base / 'data', '--random-split', '--train', '6',
              '--val', '2')
    return base


@pytest.fixture(scope='module')
def coco(tmp_path_factory):
    root = tmp_path_factory.mktemp('coco')
    output_of(sys.executable, 'tools/misc/make_synthetic_coco.py', root,
              '--train', '2', '--val', '2', '--size', '96', '--seed', '1')
    return root


def copy_of(src, tmp_path):
    dst = tmp_path / 'data'
    shutil.copytree(src, dst)
    return dst


def files(root, pattern):
    return sorted(glob.glob(str(root / pattern)))


def check(tool, capsys, config, data_root, *options, splits=None):
    """Exit status and output of the tool, run in-process, with
    ``--cfg-options data_root=... *options``."""
    status = tool.main([
        config, *(['--splits', *splits] if splits else []), '--cfg-options',
        f'data_root={data_root}', *options
    ])
    captured = capsys.readouterr()
    return status, captured.out + captured.err


@pytest.mark.parametrize('kind', ['seg', 'det'])
@pytest.mark.slow
def test_clean_sets_pass(kind, tool, capsys, kvasir, coco):
    config, root = ((SEG_CONFIG, kvasir / 'data') if kind == 'seg' else
                    (DET_CONFIG, coco))
    status, out = check(tool, capsys, config, root)
    assert status == 0, out
    assert 'no problems' in out
    if kind == 'seg':
        assert 'train_dataloader.dataset 6 samples' in out
        assert 'val_dataloader.dataset 2 samples' in out
        # the Kvasir test split is the val split: read once
        assert 'test_dataloader.dataset: the same data as ' \
            'val_dataloader.dataset' in out
    else:
        assert 'train_dataloader.dataset 2 samples' in out


def write_mask(path, mask):
    assert cv2.imwrite(str(path), mask)


def test_every_segmentation_problem_is_reported_at_once(
        tool, capsys, kvasir, tmp_path):
    root = copy_of(kvasir / 'data', tmp_path)
    train_masks = files(root, 'ann_dir/train/*.png')
    train_images = files(root, 'img_dir/train/*.jpg')
    val_masks = files(root, 'ann_dir/val/*.png')
    # the synthetic images are 160x120
    write_mask(val_masks[0], np.zeros((60, 80), np.uint8))  # crashes late
    write_mask(train_masks[0], np.ones((120, 80), np.uint8))  # stretched
    mask = cv2.imread(train_masks[1], cv2.IMREAD_UNCHANGED)
    mask[:5, :5] = 200  # changes the metrics silently
    write_mask(train_masks[1], mask)
    os.remove(train_masks[2])
    with open(train_images[3], 'wb') as f:
        f.write(b'not a jpeg')

    status, out = check(tool, capsys, SEG_CONFIG, root)
    assert status == 1, out
    lines = out.splitlines()

    def line_of(path):
        found = [line for line in lines if line.strip().startswith(path)]
        assert found, f'{path} not reported:\n{out}'
        return found[0]

    assert 'mask is 80x60' in line_of(val_masks[0])
    assert '160x120' in line_of(val_masks[0])
    assert 'mask is 80x120' in line_of(train_masks[0])
    assert 'mask values 200 (25 pixels) outside the label set 0-1 and the ' \
        'ignore index 255' in line_of(train_masks[1])
    assert 'mask missing' in line_of(train_masks[2])
    assert 'image unreadable' in line_of(train_images[3])
    assert '5 problem(s) in train_dataloader.dataset, ' \
        'val_dataloader.dataset' in out


def check_val_reducing_zero_label(tool, capsys, root):
    """:func:`check` of the val split with reduce_zero_label on."""
    return check(
        tool,
        capsys,
        SEG_CONFIG,
        root,
        'val_dataloader.dataset.reduce_zero_label=True',
        splits=['val'])


def test_label_set_follows_reduce_zero_label(tool, capsys, kvasir, tmp_path):
    """With reduce_zero_label the file values 0..num_classes are labels (0
    becomes the ignore index)."""
    root = copy_of(kvasir / 'data', tmp_path)
    mask_path = files(root, 'ann_dir/val/*.png')[0]
    mask = cv2.imread(mask_path, cv2.IMREAD_UNCHANGED)
    mask[:3, :3] = 2
    write_mask(mask_path, mask)
    status, out = check(tool, capsys, SEG_CONFIG, root, splits=['val'])
    assert status == 1 and f'{mask_path}: mask values 2 (9 pixels)' in out
    status, out = check_val_reducing_zero_label(tool, capsys, root)
    assert status == 0, out


def test_unconverted_0_255_masks_are_a_problem(tool, capsys, kvasir, tmp_path):
    """A split whose masks hold 0 and 255 only (raw masks, never converted
    to 0/1) is reported once: 255 is the ignore index, so a run would learn
    and score background alone. One mask converted (a 1 somewhere) or a
    label set it does not apply to (reduce_zero_label) passes."""
    root = copy_of(kvasir / 'data', tmp_path)
    masks = files(root, 'ann_dir/val/*.png')
    for path in masks:
        write_mask(path, cv2.imread(path, cv2.IMREAD_UNCHANGED) * 255)
    status, out = check(tool, capsys, SEG_CONFIG, root, splits=['val'])
    assert status == 1, out
    assert (f'{root}/ann_dir/val: no mask holds a label other than 0 but '
            'masks hold 255, the ignore index') in out
    assert '1 problem(s) in val_dataloader.dataset' in out
    status, out = check_val_reducing_zero_label(tool, capsys, root)
    assert 'no mask holds a label other than 0' not in out
    mask = cv2.imread(masks[0], cv2.IMREAD_UNCHANGED)
    mask[:2, :2] = 1
    write_mask(masks[0], mask)
    status, out = check(tool, capsys, SEG_CONFIG, root, splits=['val'])
    assert status == 0, out


def test_empty_split_is_a_problem(tool, capsys, kvasir, tmp_path):
    root = copy_of(kvasir / 'data', tmp_path)
    for path in files(root, 'img_dir/val/*'):
        os.remove(path)
    status, out = check(tool, capsys, SEG_CONFIG, root)
    assert status == 1, out
    assert f"empty split, no '*.jpg' image in {root}/img_dir/val" in out
    assert 'train_dataloader.dataset 6 samples' not in out  # not a pass
    assert '1 problem(s) in val_dataloader.dataset' in out


def test_coco_problems_are_reported_with_their_image(tool, capsys, coco,
                                                     tmp_path):
    root = copy_of(coco, tmp_path)
    missing = files(root, 'val2017/*.jpg')[0]
    os.remove(missing)
    ann_path = root / 'annotations/instances_train2017.json'
    ann = json.load(open(ann_path))
    images = {i['id']: i['file_name'] for i in ann['images']}
    outside, flat = ann['annotations'][:2]
    outside['bbox'] = [50, 50, 80, 10]  # in a 96x96 image
    flat['bbox'] = [10, 10, 0, 5]
    json.dump(ann, open(ann_path, 'w'))

    status, out = check(tool, capsys, DET_CONFIG, root)
    assert status == 1, out
    assert f'{missing}: image missing' in out
    assert (f'{root}/train2017/{images[outside["image_id"]]}: annotation id '
            f'{outside["id"]}: bbox [50, 50, 80, 10] (x, y, w, h) reaches '
            'outside the 96x96 image') in out
    assert (f'{root}/train2017/{images[flat["image_id"]]}: annotation id '
            f'{flat["id"]}: bbox [10, 10, 0, 5] has no area') in out
    assert '3 problem(s)' in out


def test_coco_class_missing_from_the_annotations(tool, capsys, coco):
    status, out = check(
        tool,
        capsys,
        DET_CONFIG,
        coco,
        'val_dataloader.dataset.metainfo.classes=(circle,rectangle,star)',
        splits=['val'])
    assert status == 1, out
    assert "class 'star' of the dataset's metainfo is not a category" in out
    # no class of the file: every training image is filtered out
    status, out = check(
        tool,
        capsys,
        DET_CONFIG,
        coco,
        'train_dataloader.dataset.metainfo.classes=(star,)',
        splits=['train'])
    assert status == 1, out
    assert f'{coco}/annotations/instances_train2017.json: empty split' in out


@pytest.mark.slow
def test_command_line_exit_status(kvasir, tmp_path):
    root = copy_of(kvasir / 'data', tmp_path)
    result = run(sys.executable, TOOL, SEG_CONFIG, '--cfg-options',
                 f'data_root={root}', '--header-only')
    assert 'no problems' in result.stdout
    mask = files(root, 'ann_dir/val/*.png')[1]
    os.remove(mask)
    result = run(
        sys.executable,
        TOOL,
        SEG_CONFIG,
        '--cfg-options',
        f'data_root={root}',
        '--header-only',
        check=False)
    assert result.returncode == 1
    assert f'{mask}: mask missing' in result.stdout


def test_config_that_cannot_be_checked_exits_2(tool, capsys, tmp_path):
    config = tmp_path / 'no_data.py'
    config.write_text('model = dict(type="Foo")\n')
    status = tool.main([str(config)])
    out = capsys.readouterr()
    assert status == 2
    assert 'no dataset in train_dataloader, val_dataloader' in out.err


# --------------------------------------------------------------------------
# the medical datasets refuse empty splits


def medical_dataset(root, split='val', **kwargs):
    from kcla_mm.datasets import KvasirSEGDataset
    return KvasirSEGDataset(
        data_root=str(root),
        data_prefix=dict(
            img_path=f'img_dir/{split}', seg_map_path=f'ann_dir/{split}'),
        pipeline=[],
        **kwargs)


def test_medical_dataset_refuses_an_empty_split(kvasir, tmp_path):
    from kcla_mm.datasets import EmptySplitError
    root = copy_of(kvasir / 'data', tmp_path)
    assert len(medical_dataset(root)) == 2
    for path in files(root, 'img_dir/val/*'):
        os.remove(path)
    lazy = medical_dataset(root, lazy_init=True)  # nothing read yet
    with pytest.raises(
            EmptySplitError, match=re.escape(f'{root}/img_dir/val')):
        lazy.full_init()
    with pytest.raises(EmptySplitError, match='empty split'):
        medical_dataset(root)
    with pytest.raises(
            FileNotFoundError,
            match=re.escape(f'image folder {root}/img_dir/nope not found')):
        medical_dataset(root, split='nope')


# --------------------------------------------------------------------------
# the converters refuse empty splits


def prepare_kvasir(raw, out, *extra):
    return run(
        sys.executable,
        'tools/dataset_converters/prepare_kvasir.py',
        raw,
        out,
        *extra,
        check=False)


@pytest.mark.parametrize('counts,option', [(('8', '0'), '--val=0'),
                                           (('0', '8'), '--train=0')])
@pytest.mark.slow
def test_kvasir_converter_refuses_an_empty_split(counts, option, kvasir,
                                                 tmp_path):
    out = tmp_path / 'out'
    result = prepare_kvasir(kvasir / 'raw', out, '--random-split', '--train',
                            counts[0], '--val', counts[1])
    assert result.returncode != 0
    assert f'{option} would leave the' in result.stderr
    assert not out.exists()


@pytest.mark.slow
def test_kvasir_converter_refuses_an_empty_split_file(kvasir, tmp_path):
    ids = sorted(f[:-4] for f in os.listdir(kvasir / 'raw/Kvasir-SEG/images'))
    (tmp_path / 'train.txt').write_text('\n'.join(ids))
    (tmp_path / 'val.txt').write_text('\n')
    out = tmp_path / 'out'
    result = prepare_kvasir(kvasir / 'raw', out, '--split-files',
                            tmp_path / 'train.txt', tmp_path / 'val.txt')
    assert result.returncode == 1
    assert 'the val split would be empty (--split-files: ' \
        f'{tmp_path}/val.txt lists no id)' in result.stderr
    assert not out.exists()


@pytest.fixture(scope='module')
def isic2018_train_only(tmp_path_factory):
    raw = tmp_path_factory.mktemp('isic2018') / 'raw'
    output_of(sys.executable, 'tools/misc/make_synthetic_medseg.py',
              '--layout', 'isic2018', raw, '--count', '4', '--train-only')
    return raw


@pytest.mark.parametrize('ratios,message', [
    (('0', '0.2'), '--val-ratio=0 would leave the val split empty'),
    (('0.2', '0'), '--test-ratio=0 would leave the test split empty'),
    (('0.1', '0.3'),
     'the val split would be empty (--val-ratio=0.1 of 4 samples)'),
])
@pytest.mark.slow
def test_isic_converter_refuses_an_empty_split(ratios, message,
                                               isic2018_train_only, tmp_path):
    out = tmp_path / 'out'
    result = run(
        sys.executable,
        'tools/dataset_converters/prepare_isic.py',
        '--year',
        '2018',
        isic2018_train_only,
        out,
        '--val-ratio',
        ratios[0],
        '--test-ratio',
        ratios[1],
        check=False)
    assert result.returncode != 0
    assert message in result.stderr
    assert not out.exists()


def test_write_splits_refuses_an_empty_split_before_writing(tmp_path):
    from kcla_mm.datasets.preparation import (PreparationError, Sample,
                                              write_splits)
    image = tmp_path / 'a.jpg'
    cv2.imwrite(str(image), np.zeros((8, 8, 3), np.uint8))
    cv2.imwrite(str(tmp_path / 'a.png'), np.zeros((8, 8), np.uint8))
    sample = Sample('a', str(image), str(tmp_path / 'a.png'))
    with pytest.raises(PreparationError, match='the val split would be empty'):
        write_splits(dict(train=[sample], val=[]), str(tmp_path / 'out'))
    assert not osp.exists(tmp_path / 'out')


def tiny_pairs(folder, names, size=(8, 8)):
    from kcla_mm.datasets.preparation import Sample
    os.makedirs(folder, exist_ok=True)
    samples = []
    for name in names:
        image = osp.join(folder, name + '.jpg')
        mask = osp.join(folder, name + '.png')
        cv2.imwrite(image, np.full((*size, 3), 90, np.uint8))
        cv2.imwrite(mask, np.full(size, 255, np.uint8))
        samples.append(Sample(name, image, mask))
    return samples


def test_write_splits_checks_every_pair_before_writing(tmp_path):
    from kcla_mm.datasets.preparation import PreparationError, write_splits
    train = tiny_pairs(str(tmp_path / 'raw'), ['a', 'b'])
    test = tiny_pairs(str(tmp_path / 'raw'), ['c', 'd'])
    with open(test[-1].image, 'wb') as f:
        f.write(b'not a jpeg')
    with pytest.raises(
            PreparationError,
            match=re.escape(f'{test[-1].image}: unreadable image')):
        write_splits(dict(train=train, test=test), str(tmp_path / 'out'))
    assert not osp.exists(tmp_path / 'out')

    cv2.imwrite(test[-1].image, np.zeros((8, 8, 3), np.uint8))
    cv2.imwrite(test[-1].mask, np.zeros((8, 9), np.uint8))
    with pytest.raises(
            PreparationError, match=re.escape(f'{test[-1].mask}: mask size')):
        write_splits(dict(train=train, test=test), str(tmp_path / 'out'))
    assert not osp.exists(tmp_path / 'out')


def test_write_splits_refuses_an_output_folder_with_files(tmp_path):
    from kcla_mm.datasets.preparation import PreparationError, write_splits
    samples = tiny_pairs(str(tmp_path / 'raw'), ['a', 'b', 'c'])
    out = tmp_path / 'out'
    os.makedirs(out / 'img_dir' / 'train')  # empty folders are fine
    counts = write_splits(dict(train=samples[:2], val=samples[2:]), str(out))
    assert counts == dict(train=2, val=1)
    before = sorted(glob.glob(str(out / '**' / '*'), recursive=True))
    with pytest.raises(
            PreparationError,
            match=re.escape(f'{out}/img_dir already holds files (e.g. '
                            f'{out}/img_dir/train/a.jpg): choose an empty or '
                            f'new output folder, or delete {out}/img_dir and '
                            f'{out}/ann_dir first (nothing was written)')):
        write_splits(dict(train=samples[2:], val=samples[:2]), str(out))
    assert sorted(glob.glob(str(out / '**' / '*'), recursive=True)) == before

    shutil.rmtree(out / 'img_dir')  # masks left over are refused too
    with pytest.raises(PreparationError, match='ann_dir already holds'):
        write_splits(dict(train=samples), str(out))
    (tmp_path / 'file').write_text('')
    with pytest.raises(PreparationError, match='is a file, not a folder'):
        write_splits(dict(train=samples), str(tmp_path / 'file'))
