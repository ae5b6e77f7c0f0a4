"""RandomStateHook: a resumed run equals the run it interrupts.

The end-to-end test trains the demo detector (shrunk) through tools/train.py
2 epochs straight and resumes it from its epoch-1 checkpoint, with its
persistent loader worker, and compares every state-dict tensor and every
logged epoch-2 loss bit for bit. The unit tests run the hook in mmengine's
Runner on a toy model (in-process, CPU).
"""
import glob
import itertools
import json
import os.path as osp
import random
import sys

import numpy as np
import pytest
import torch
import torch.nn as nn
from mmengine.model import BaseModel
from mmengine.runner import Runner

from kcla_mm.engine import RandomStateHook
from kcla_mm.engine.hooks import (epoch_worker_seed, get_random_state,
                                  set_random_state)
from kcla_mm.torch_compat import WEIGHTS_ONLY_ALLOW_LIST
from kcla_mm.utils.checkpoint_safety import allow_mmengine_checkpoint_types
from helpers import output_of

DEMO = 'configs/kcla/demo/faster-rcnn_kcla-r18_fpn_synthetic-coco.py'


def draws():
    """One draw from each generator the hook keeps."""
    return (random.random(), np.random.rand(3).tolist(), np.random.randn(),
            torch.rand(3).tolist())


def test_states_are_restored_exactly(tmp_path):
    np.random.randn()  # a cached gaussian is part of numpy's state
    state = get_random_state()
    expected = draws()
    draws()
    # Through a checkpoint file as torch >= 2.6 reads it (weights_only, no
    # allow-list needed for the states themselves).
    torch.save(dict(random_state=state), tmp_path / 'state.pth')
    loaded = torch.load(tmp_path / 'state.pth', weights_only=True)
    set_random_state(loaded['random_state'])
    assert draws() == expected


def test_worker_seeds_differ_per_epoch_rank_and_worker():
    seeds = {
        epoch_worker_seed(0, epoch, rank, worker)
        for epoch in range(4)
        for rank in range(2)
        for worker in range(4)
    }
    assert len(seeds) == 32
    assert epoch_worker_seed(0, 1, 0, 0) == epoch_worker_seed(0, 1, 0, 0)
    assert epoch_worker_seed(0, 1, 0, 0) != epoch_worker_seed(1, 1, 0, 0)


class NoisyModel(BaseModel):
    """A linear model whose loss draws from torch's, numpy's and Python's
    generators, as a drop path and a data pipeline do."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(2, 1)

    def forward(self, inputs, labels=None, mode='loss'):
        noise = torch.rand(1) + float(np.random.rand()) + random.random()
        loss = ((self.linear(torch.stack(inputs)) - noise)**2).mean()
        return dict(loss=loss)


class ToyData(torch.utils.data.Dataset):

    def __len__(self):
        return 4

    def __getitem__(self, index):
        # augmentation drawn in the loader worker
        return dict(
            inputs=torch.full((2, ), float(index)) + float(np.random.rand()))


RUNNERS = itertools.count()


def toy_runner(work_dir, max_epochs, resume=False, load_from=None, hook=True):
    torch.manual_seed(0)  # the model's initial weights
    return Runner(
        model=NoisyModel(),
        work_dir=str(work_dir),
        train_dataloader=dict(
            dataset=ToyData(),
            sampler=dict(type='DefaultSampler', shuffle=True),
            batch_size=2,
            num_workers=1,
            persistent_workers=True),
        optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.1)),
        train_cfg=dict(by_epoch=True, max_epochs=max_epochs),
        default_hooks=dict(
            logger=dict(type='LoggerHook', interval=1),
            checkpoint=dict(type='CheckpointHook', interval=1)),
        custom_hooks=[dict(type='RandomStateHook')] if hook else None,
        randomness=dict(seed=0),
        resume=resume,
        load_from=load_from,
        default_scope='mmengine',
        # one logger (and log file) per runner
        experiment_name=f'toy_{next(RUNNERS)}',
    )


def train_toy(*args, **kwargs):
    runner = toy_runner(*args, **kwargs)
    runner.train()
    # Without the hook, the persistent worker would be left to the garbage
    # collector, whose DataLoader.__del__ can wait 10 s on it.
    iterator = runner.train_dataloader._iterator
    if iterator is not None:
        iterator._shutdown_workers()
    return runner


def weights(path):
    return torch.load(path, map_location='cpu')['state_dict']


def test_checkpoint_holds_every_state_and_loads_weights_only(tmp_path):
    runner = toy_runner(tmp_path, max_epochs=1)
    runner.train()
    allow_mmengine_checkpoint_types()
    checkpoint = torch.load(
        tmp_path / 'epoch_1.pth', weights_only=WEIGHTS_ONLY_ALLOW_LIST)
    saved = checkpoint['random_state']
    assert saved['epoch_end'] and saved['world_size'] == 1
    ours = saved['ranks'][0]
    assert set(ours) >= {'python', 'numpy', 'torch'}
    # what the hook took when the epoch ended
    hook = next(h for h in runner.hooks if isinstance(h, RandomStateHook))
    taken = hook._boundary['ranks'][0]
    assert ours['python'] == taken['python']
    assert torch.equal(ours['torch'], taken['torch'])
    assert torch.equal(ours['numpy']['key'], taken['numpy']['key'])
    # Saved later but before any iteration, as the best checkpoint after
    # validation (whose meta counts one iteration more): the same states.
    runner.save_checkpoint(str(tmp_path), 'best.pth', by_epoch=False)
    best = torch.load(
        tmp_path / 'best.pth',
        weights_only=WEIGHTS_ONLY_ALLOW_LIST)['random_state']
    assert best['epoch_end']
    assert torch.equal(best['ranks'][0]['torch'], ours['torch'])


def test_toy_resume_equals_straight_run_and_not_without_hook(tmp_path):
    for hook in (True, False):
        straight, interrupted = (tmp_path / f'straight_{hook}',
                                 tmp_path / f'interrupted_{hook}')
        train_toy(straight, max_epochs=2, hook=hook)
        train_toy(interrupted, max_epochs=1, hook=hook)
        train_toy(interrupted, max_epochs=2, resume=True, hook=hook)
        ours = weights(interrupted / 'epoch_2.pth')['linear.weight']
        theirs = weights(straight / 'epoch_2.pth')['linear.weight']
        assert torch.equal(ours, theirs) == hook


def test_checkpoint_without_the_key_resumes_with_a_warning(tmp_path):
    train_toy(tmp_path, max_epochs=1, hook=False)
    assert 'random_state' not in torch.load(
        tmp_path / 'epoch_1.pth', weights_only=False)
    runner = toy_runner(tmp_path, max_epochs=2, resume=True)
    runner.train()
    log = open(glob.glob(osp.join(runner.log_dir, '*.log'))[0]).read()
    assert "the resumed checkpoint has no 'random_state'" in log
    assert osp.isfile(tmp_path / 'epoch_2.pth')


def test_load_from_restores_nothing(tmp_path):
    toy_runner(tmp_path / 'a', max_epochs=1).train()
    runner = toy_runner(
        tmp_path / 'b',
        max_epochs=1,
        load_from=str(tmp_path / 'a/epoch_1.pth'))
    runner.train()
    hook = next(h for h in runner.hooks if isinstance(h, RandomStateHook))
    # A fresh start: the loaded states are dropped, nothing warns.
    assert hook._loaded is None
    log = open(glob.glob(osp.join(runner.log_dir, '*.log'))[0]).read()
    assert 'RandomStateHook:' not in log


# --- the demo detector through tools/train.py ---------------------------


@pytest.fixture(scope='module')
def coco_root(tmp_path_factory, repo_root):
    root = tmp_path_factory.mktemp('synthetic_coco')
    output_of(sys.executable, 'tools/misc/make_synthetic_coco.py', root,
              '--train', '8', '--val', '2', '--size', '64', '--seed', '3')
    return root


def demo_options(coco_root):
    """The demo config shrunk: 2 epochs of 4 iterations on 8 images of
    64x64, validated and saved every epoch (validation draws from torch's
    generator between the epochs of the straight run only), its persistent
    loader worker kept."""
    return [
        '--cfg-options', f'data_root={coco_root}', 'train_cfg.max_epochs=2',
        'train_cfg.val_interval=1', 'default_hooks.logger.interval=1',
        'default_hooks.checkpoint.interval=1',
        'default_hooks.checkpoint.max_keep_ckpts=-1',
        'train_dataloader.batch_size=2',
        'train_dataloader.dataset.pipeline.2.scale=(64,64)',
        'val_dataloader.dataset.pipeline.1.scale=(64,64)',
        'test_dataloader.dataset.pipeline.1.scale=(64,64)',
        'model.backbone.base_channels=16',
        'model.neck.in_channels=[16,32,64,128]'
    ]


def train(coco_root, work_dir, *extra):
    return output_of(sys.executable, 'tools/train.py', DEMO, '--work-dir',
                     work_dir, *extra, *demo_options(coco_root))


def epoch_losses(work_dir, epoch):
    rows = []
    for path in glob.glob(osp.join(work_dir, '*/vis_data/scalars.json')):
        for line in open(path):
            row = json.loads(line)
            if row.get('epoch') == epoch and 'loss' in row:
                rows.append({k: v for k, v in row.items() if 'loss' in k})
    return rows


@pytest.mark.slow
def test_demo_resumed_at_an_epoch_boundary_equals_the_straight_run(
        coco_root, tmp_path):
    """The run interrupted in epoch 2 is the straight run itself: its
    epoch_1.pth is what an interrupted run leaves."""
    straight, resumed = tmp_path / 'straight', tmp_path / 'resumed'
    train(coco_root, straight)
    log = train(coco_root, resumed, '--resume', straight / 'epoch_1.pth')
    assert 'resumed epoch: 1' in log
    assert 'RandomStateHook:' not in log  # no warning: the states were there

    ours, theirs = (weights(resumed / 'epoch_2.pth'),
                    weights(straight / 'epoch_2.pth'))
    assert list(ours) == list(theirs)
    differing = [k for k in ours if not torch.equal(ours[k], theirs[k])]
    assert differing == []
    # BN running statistics are among them
    assert any(k.endswith('running_var') for k in ours)

    losses = epoch_losses(resumed, 2)
    assert len(losses) == 4 and all('loss_rpn_cls' in r for r in losses)
    assert losses == epoch_losses(straight, 2)
