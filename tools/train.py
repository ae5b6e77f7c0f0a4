"""Train a detector, segmentor or classifier with a KCLA backbone
(mmdet/mmseg/mmpretrain style).

    python tools/train.py CONFIG [--work-dir DIR] [--resume [PATH]] [--amp]
        [--cfg-options data_root=data/coco/ KEY=VALUE ...]
        [--launcher none|pytorch|slurm|mpi]

The config's ``default_scope`` (mmdet, mmseg or mmpretrain) decides the
registries.
``--cfg-options data_root=PATH`` re-points every dataset and evaluator.
A checkpoint to resume from or to start from (``load_from``) that is
missing, truncated, not a checkpoint, or holds NaN/Inf tensors is refused in
one line (``error: PATH: cause``, exit status 1).
"""
import argparse
import os
import os.path as osp
import sys

import torch
from mmengine.config import Config

import kcla_mm  # noqa: F401  registers the KCLA modules
from kcla_mm.utils.checkpoint_loading import (CheckpointError,
                                              checked_checkpoint_loading,
                                              is_local_path,
                                              probe_checkpoint_file)
from kcla_mm.utils.config import (PretrainedFileNotFoundError, add_cfg_options,
                                  check_pretrained_files, load_config)
from kcla_mm.utils.distributed import run_runner


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description='Train a model')
    parser.add_argument('config', help='train config file path')
    parser.add_argument('--work-dir', help='the dir to save logs and models')
    parser.add_argument(
        '--amp', action='store_true', help='automatic mixed precision')
    parser.add_argument(
        '--auto-scale-lr',
        action='store_true',
        help='scale the learning rate with the total batch size')
    parser.add_argument(
        '--resume',
        nargs='?',
        type=str,
        const='auto',
        help='resume from PATH, or from the latest checkpoint in the work '
        'dir when no PATH is given')
    add_cfg_options(parser)
    parser.add_argument(
        '--launcher',
        choices=['none', 'pytorch', 'slurm', 'mpi'],
        default='none',
        help='job launcher')
    # torch.distributed.launch passes --local-rank (torchrun sets LOCAL_RANK)
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0)
    args = parser.parse_args(argv)
    os.environ.setdefault('LOCAL_RANK', str(args.local_rank))
    return args


def build_cfg(args) -> Config:
    cfg = load_config(args.config, args.cfg_options, args.launcher,
                      args.work_dir)
    if args.amp:
        if not torch.cuda.is_available():
            raise ValueError('--amp needs a CUDA device: mmengine 0.10.7\'s '
                             'AmpOptimWrapper does not run on the CPU')
        cfg.optim_wrapper.type = 'AmpOptimWrapper'
        cfg.optim_wrapper.loss_scale = 'dynamic'
    if args.auto_scale_lr:
        if 'base_batch_size' not in cfg.get('auto_scale_lr', {}):
            raise ValueError(f'{args.config}: --auto-scale-lr needs '
                             'auto_scale_lr.base_batch_size in the config')
        cfg.auto_scale_lr.enable = True
    if args.resume == 'auto':
        cfg.resume = True
        cfg.load_from = None
    elif args.resume is not None:
        if not osp.isfile(args.resume):
            raise FileNotFoundError(f'--resume {args.resume}: no such file')
        cfg.resume = True
        cfg.load_from = args.resume
    # What needs no unpickling is refused before the datasets load; the
    # rest (non-finite tensors, refused types) as the runner loads it.
    if cfg.get('load_from') and is_local_path(cfg.load_from):
        probe_checkpoint_file(cfg.load_from)
    return cfg


def main(argv=None):
    args = parse_args(argv)
    try:
        cfg = build_cfg(args)
        # Before the runner builds datasets: a missing backbone checkpoint
        # should not surface only after minutes of annotation loading.
        check_pretrained_files(cfg)
    except PretrainedFileNotFoundError as exc:
        # The library names the config key; here is how to set it.
        sys.exit(f'error: {exc}. Train KCLA ImageNet weights with '
                 'configs/kcla/kcla-r50_8xb32_in1k.py, convert an official '
                 'checkpoint you have with '
                 'tools/model_converters/kcla_official2mm.py, or start from '
                 'plain ResNet weights (the *-warmstart config); here: '
                 f'--cfg-options {exc.key}.checkpoint=PATH or '
                 f'{exc.key}=None')
    except (FileNotFoundError, ValueError) as exc:
        sys.exit(f'error: {exc}')
    try:
        with checked_checkpoint_loading():
            run_runner(cfg, 'train')
    except CheckpointError as exc:
        sys.exit(f'error: {exc}')


if __name__ == '__main__':
    main()
