"""Detection configs through tools/train.py, tools/test.py, dist_train.sh
and tools/infer.py, on a generated COCO-layout set (subprocesses, CPU)."""
import json
import os
import os.path as osp
import re
import subprocess
import sys

import pytest
import torch
from mmengine.utils import digit_version

from helpers import free_port, output_of

CLASSES = '(circle,rectangle,triangle)'
CONFIGS = {
    'faster-r50': 'configs/kcla/faster-rcnn_kcla-r50_fpn_1x_coco.py',
    'faster-r101': 'configs/kcla/faster-rcnn_kcla-r101_fpn_1x_coco.py',
    'mask-r50': 'configs/kcla/mask-rcnn_kcla-r50_fpn_1x_coco.py',
    'mask-r101': 'configs/kcla/mask-rcnn_kcla-r101_fpn_1x_coco.py',
}


@pytest.fixture(scope='module')
def coco_root(tmp_path_factory, repo_root):
    root = tmp_path_factory.mktemp('synthetic_coco')
    subprocess.run([
        sys.executable, 'tools/misc/make_synthetic_coco.py',
        str(root), '--train', '2', '--val', '2', '--size', '96', '--seed', '1'
    ],
                   check=True,
                   capture_output=True,
                   cwd=repo_root)
    return root


def synthetic_options(coco_root, *extra, small_backbone=False, mask=False):
    """--cfg-options that point a COCO config at the synthetic set (3
    classes) and shrink images; the model is the config's own unless
    small_backbone."""
    opts = [
        f'data_root={coco_root}',
        'model.backbone.init_cfg=None',
        'model.roi_head.bbox_head.num_classes=3',
        'train_cfg.max_epochs=1',
        'default_hooks.logger.interval=1',
        # an untrained model scores far below mmdet's 0.05
        'model.test_cfg.rcnn.score_thr=0.0',
        'train_dataloader.batch_size=2'
    ]
    for loader in ('train', 'val', 'test'):
        opts += [
            f'{loader}_dataloader.num_workers=0',
            f'{loader}_dataloader.persistent_workers=False',
            f'{loader}_dataloader.dataset.metainfo.classes={CLASSES}'
        ]
    opts += [
        'train_dataloader.dataset.pipeline.2.scale=(96,96)',
        'val_dataloader.dataset.pipeline.1.scale=(96,96)',
        'test_dataloader.dataset.pipeline.1.scale=(96,96)'
    ]
    if mask:
        opts.append('model.roi_head.mask_head.num_classes=3')
    if small_backbone:
        opts += [
            'model.backbone.depth=18', 'model.backbone.base_channels=16',
            'model.backbone.head_dim=16',
            'model.neck.in_channels=[16,32,64,128]'
        ]
    return ['--cfg-options', *opts, *extra]


def metrics(log, prefix):
    return {
        k: float(v)
        for k, v in re.findall(rf'({prefix}/\w+): (-?[\d.]+)', log)
    }


@pytest.mark.parametrize('name', list(CONFIGS))
@pytest.mark.slow
def test_config_trains_one_iteration_and_tests(name, coco_root, tmp_path,
                                               repo_root):
    config = CONFIGS[name]
    log = output_of(
        sys.executable, 'tools/train.py', config, '--work-dir', str(tmp_path),
        *synthetic_options(coco_root, mask=name.startswith('mask')))
    assert 'Epoch(train) [1][1/1]' in log
    # The real depth of the config, not a small stand-in.
    depth = 101 if 'r101' in name else 50
    dumped = open(tmp_path / osp.basename(config)).read()
    assert f'depth={depth}' in dumped and "type='KCLAResNet'" in dumped
    checkpoint = tmp_path / 'epoch_1.pth'
    assert checkpoint.is_file()

    log = output_of(
        sys.executable, 'tools/test.py', config, str(checkpoint), '--work-dir',
        str(tmp_path),
        *synthetic_options(coco_root, mask=name.startswith('mask')))
    found = metrics(log, 'coco')
    assert 'coco/bbox_mAP' in found and 'coco/bbox_mAP_50' in found
    if name.startswith('mask'):
        assert 'coco/segm_mAP' in found and 'coco/segm_mAP_50' in found


@pytest.mark.slow
def test_resume_continues_at_the_right_iteration_with_weights_only(
        coco_root, tmp_path, repo_root):
    from kcla_mm.torch_compat import load_checkpoint_file
    from kcla_mm.utils.checkpoint_safety import allow_mmengine_checkpoint_types
    config = CONFIGS['faster-r50']
    opts = synthetic_options(coco_root, small_backbone=True)
    output_of(sys.executable, 'tools/train.py', config, '--work-dir',
              str(tmp_path), *opts)
    checkpoint = tmp_path / 'epoch_1.pth'

    # The checkpoint really needs the allow-list: plain weights_only fails.
    plain = subprocess.run([
        sys.executable, '-c',
        f'import torch; torch.load({str(checkpoint)!r}, weights_only=True)'
    ],
                           capture_output=True,
                           text=True)
    # torch 2.13 says "Unsupported global", torch 2.1 "Unsupported class".
    assert plain.returncode != 0
    assert re.search('Unsupported (global|class)', plain.stderr)

    env = dict(os.environ)
    env.pop('TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD', None)
    log = output_of(
        sys.executable,
        'tools/train.py',
        config,
        '--work-dir',
        str(tmp_path),
        '--resume',
        str(checkpoint),
        *opts,
        'train_cfg.max_epochs=2',
        env=env)
    assert 'resumed epoch: 1, iter: 1' in log
    assert 'Epoch(train) [2][1/1]' in log
    assert 'Epoch(train) [1][1/1]' not in log
    allow_mmengine_checkpoint_types()
    # weights_only=True where torch has the allow-list (torch >= 2.6).
    resumed = load_checkpoint_file(str(tmp_path / 'epoch_2.pth'))
    assert resumed['meta']['iter'] == 2 and resumed['meta']['epoch'] == 2
    assert 'message_hub' in resumed and 'optimizer' in resumed


def test_allow_list_refuses_other_getattr():
    from mmengine.logging import HistoryBuffer

    from kcla_mm.utils.checkpoint_safety import _history_buffer_getattr
    assert _history_buffer_getattr(HistoryBuffer, 'min') is HistoryBuffer.min
    with pytest.raises(Exception, match='only HistoryBuffer'):
        _history_buffer_getattr(os, 'system')
    with pytest.raises(Exception, match='only HistoryBuffer'):
        _history_buffer_getattr(HistoryBuffer, '__init__')


@pytest.mark.slow
def test_dist_train_two_cpu_processes(coco_root, tmp_path, repo_root):
    env = dict(
        os.environ,
        PORT=str(free_port()),
        PYTHON=sys.executable,
        OMP_NUM_THREADS='1')
    log = output_of(
        'bash',
        'tools/dist_train.sh',
        CONFIGS['faster-r50'],
        '2',
        '--work-dir',
        str(tmp_path),
        *synthetic_options(coco_root, small_backbone=True),
        env=env)
    assert "dist_cfg: {'backend': 'gloo'}" in log
    # mmengine's wording for the world size
    assert 'Distributed training: True' in log and 'GPU number: 2' in log
    # 2 images, 2 processes, batch 2 each: one iteration per epoch
    assert 'Epoch(train) [1][1/1]' in log
    checkpoints = [f for f in os.listdir(tmp_path) if f.endswith('.pth')]
    assert checkpoints == ['epoch_1.pth']
    assert log.count('Saving checkpoint at 1 epochs') == 1


# Runs a tool's main() with a recorded default group: the group must be
# freed when main() returns, not left to interpreter exit, where a gloo
# group's threads can abort a finished run (the two-process tests
# failed that way now and then, in CI).
FREES_GROUP = """
import sys, weakref
import torch.distributed as dist
sys.path.insert(0, 'tests')
from helpers import load_tool
groups = []
init_process_group = dist.init_process_group
def recording_init(*args, **kwargs):
    init_process_group(*args, **kwargs)
    groups.append(weakref.ref(dist.group.WORLD))
dist.init_process_group = recording_init
load_tool(sys.argv[1]).main(sys.argv[2:])
assert len(groups) == 1, groups
print('group alive after main:', groups[0]() is not None)
"""


@pytest.mark.slow
@pytest.mark.parametrize('strategy', [None, 'fsdp'])
def test_tools_free_the_process_group(strategy, coco_root, tmp_path,
                                      repo_root):
    """tools/train.py (mmengine's Runner, and a FlexibleRunner with FSDP)
    and tools/test.py as one process of a ``--launcher pytorch`` run."""
    config = CONFIGS['faster-r50']
    if strategy is not None:
        if digit_version(torch.__version__) < digit_version('2.4'):
            pytest.skip(f'FSDP on the CPU needs torch >= 2.4 (torch '
                        f'{torch.__version__} asks for a CUDA stream)')
        config = tmp_path / f'faster-rcnn_kcla_{strategy}.py'
        config.write_text('_base_ = [%r, %r]\n' %
                          (osp.join(repo_root, CONFIGS['faster-r50']),
                           osp.join(repo_root, 'configs', '_base_',
                                    'strategies', f'flexible-{strategy}.py')))
    env = dict(
        os.environ,
        RANK='0',
        LOCAL_RANK='0',
        WORLD_SIZE='1',
        MASTER_ADDR='127.0.0.1',
        MASTER_PORT=str(free_port()),
        OMP_NUM_THREADS='1')
    options = synthetic_options(coco_root, small_backbone=True)
    work = tmp_path / 'work'
    recorded = [sys.executable, '-c', FREES_GROUP]
    launcher = ['--launcher', 'pytorch', '--work-dir', str(work), *options]
    log = output_of(
        *recorded, 'tools/train.py', str(config), *launcher, env=env)
    assert 'Distributed training: True' in log
    assert 'Epoch(train) [1][1/1]' in log
    assert 'group alive after main: False' in log
    if strategy is not None:
        return
    log = output_of(
        *recorded,
        'tools/test.py',
        str(config),
        str(work / 'epoch_1.pth'),
        *launcher,
        env=env)
    assert 'coco/bbox_mAP' in log
    assert 'group alive after main: False' in log


@pytest.mark.slow
@pytest.mark.parametrize('strategy', ['ddp', 'fsdp'])
def test_flexible_runner_strategies_two_cpu_processes(strategy, coco_root,
                                                      tmp_path, repo_root):
    """The KCLA Faster R-CNN config with a strategy mixin of
    configs/_base_/strategies/ in its _base_ list, through dist_train.sh:
    mmengine's FlexibleRunner trains it with DDPStrategy, or FSDPStrategy
    with every residual block (and so its KCLA layer) an FSDP unit."""
    if strategy == 'fsdp' and digit_version(
            torch.__version__) < digit_version('2.4'):
        pytest.skip(f'FSDP on the CPU needs torch >= 2.4 (torch '
                    f'{torch.__version__} asks for a CUDA stream)')
    config = tmp_path / f'faster-rcnn_kcla_{strategy}.py'
    config.write_text('_base_ = [%r, %r]\n' %
                      (osp.join(repo_root, CONFIGS['faster-r50']),
                       osp.join(repo_root, 'configs', '_base_', 'strategies',
                                f'flexible-{strategy}.py')))
    env = dict(
        os.environ,
        PORT=str(free_port()),
        PYTHON=sys.executable,
        OMP_NUM_THREADS='1')
    log = output_of(
        'bash',
        'tools/dist_train.sh',
        str(config),
        '2',
        '--work-dir',
        str(tmp_path / 'work'),
        *synthetic_options(coco_root, small_backbone=True),
        env=env)
    assert 'Distributed training: True' in log and 'GPU number: 2' in log
    assert f"type='{strategy.upper()}Strategy'" in log
    assert 'Epoch(train) [1][1/1]' in log
    # FSDPStrategy saves a folder of per-rank shards under that name.
    assert os.path.exists(tmp_path / 'work' / 'epoch_1.pth')


def test_missing_backbone_checkpoint_fails_before_data_loading(
        tmp_path, repo_root):
    result = subprocess.run([
        sys.executable, 'tools/train.py', CONFIGS['faster-r50'], '--work-dir',
        str(tmp_path), '--cfg-options',
        f'data_root={tmp_path}/no_such_dataset',
        'model.backbone.init_cfg.checkpoint=checkpoints/missing.pth'
    ],
                            cwd=repo_root,
                            capture_output=True,
                            text=True,
                            timeout=300)
    assert result.returncode != 0
    assert ("model.backbone.init_cfg.checkpoint='checkpoints/missing.pth' "
            'does not exist') in result.stderr
    assert 'kcla_official2mm.py' in result.stderr
    # It stopped before the runner touched the (missing) dataset.
    assert 'no_such_dataset' not in result.stderr.replace(
        f'data_root={tmp_path}/no_such_dataset', '')


@pytest.mark.slow
def test_infer_draws_predictions(coco_root, tmp_path, repo_root):
    config = CONFIGS['mask-r50']
    output_of(sys.executable, 'tools/train.py', config, '--work-dir',
              str(tmp_path),
              *synthetic_options(coco_root, small_backbone=True, mask=True))
    image = sorted((coco_root / 'val2017').iterdir())[0]
    out_dir = tmp_path / 'infer'
    # A training checkpoint (weights_only with the allow-list), mmdet's
    # DetInferencer behind tools/infer.py.
    log = output_of(sys.executable, 'tools/infer.py', str(image), config,
                    '--weights', str(tmp_path / 'epoch_1.pth'), '--out-dir',
                    str(out_dir), '--pred-score-thr', '0', '--cfg-options',
                    'model.backbone.depth=18',
                    'model.backbone.base_channels=16',
                    'model.backbone.head_dim=16',
                    'model.neck.in_channels=[16,32,64,128]',
                    'model.roi_head.bbox_head.num_classes=3',
                    'model.roi_head.mask_head.num_classes=3',
                    'model.test_cfg.rcnn.score_thr=0.0')
    drawn = out_dir / 'vis' / image.name
    assert drawn.is_file() and drawn.stat().st_size > 1000
    predictions = json.load(open(out_dir / 'preds' / f'{image.stem}.json'))
    assert len(predictions['scores']) > 0 and 'masks' in predictions
    assert 'drawn to' in log


def test_synthetic_coco_reads_with_stock_cocodataset(coco_root):
    from mmdet.datasets import CocoDataset
    ann = json.load(open(coco_root / 'annotations/instances_train2017.json'))
    assert [c['name']
            for c in ann['categories']] == ['circle', 'rectangle', 'triangle']
    dataset = CocoDataset(
        data_root=str(coco_root),
        ann_file='annotations/instances_train2017.json',
        data_prefix=dict(img='train2017/'),
        metainfo=dict(classes=('circle', 'rectangle', 'triangle')),
        pipeline=[],
        test_mode=True)
    assert len(dataset) == 2
    instances = [i for item in dataset for i in item['instances']]
    assert instances and all(
        len(i['bbox']) == 4 and i['mask'] and 0 <= i['bbox_label'] < 3
        for i in instances)
