"""Test a trained detector, segmentor or classifier (mmdet/mmseg/mmpretrain
style).

    python tools/test.py CONFIG CHECKPOINT [--work-dir DIR] [--out FILE]
        [--show-dir DIR] [--cfg-options data_root=PATH KEY=VALUE ...]
        [--launcher none|pytorch|slurm|mpi]

CHECKPOINT may be a training checkpoint of tools/train.py: it is loaded
with weights_only=True, with mmengine's logging types allow-listed. A file
that is missing, truncated, not a checkpoint, holds NaN/Inf tensors, or
does not hold exactly the model's tensors (a backbone's checkpoint for a
whole model, another depth) is refused in one line (``error: CHECKPOINT:
cause``, exit status 1).
"""
import argparse
import os
import os.path as osp
import sys

from mmengine.config import Config

import kcla_mm  # noqa: F401  registers the KCLA modules
from kcla_mm.utils.checkpoint_loading import (CheckpointError,
                                              checked_checkpoint_loading,
                                              probe_checkpoint_file)
from kcla_mm.utils.config import add_cfg_options, load_config
from kcla_mm.utils.distributed import run_runner


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description='Test a model')
    parser.add_argument('config', help='test config file path')
    parser.add_argument('checkpoint', help='checkpoint file')
    parser.add_argument('--work-dir', help='the dir to save the metrics')
    parser.add_argument(
        '--out',
        help='dump the raw predictions to this pickle file '
        '(detection and classification configs)')
    parser.add_argument(
        '--show-dir',
        help='save every test image with its predictions drawn to this '
        'directory (a relative DIR: under the work dir\'s timestamped '
        'folder for detectors, under the work dir for segmentors, in '
        'DIR/vis_data/vis_image, and classifiers)')
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


def enable_visualization(cfg: Config, show_dir: str) -> None:
    hooks = cfg.default_hooks
    if hooks.get('visualization') is None:
        raise KeyError('--show-dir needs default_hooks.visualization in the '
                       'config')
    scope = cfg.get('default_scope')
    if scope == 'mmpretrain':
        # mmpretrain's VisualizationHook takes enable/out_dir (it would
        # swallow mmdet's draw/test_out_dir in its **kwargs and draw
        # nothing) and writes to out_dir as given, not under the log dir.
        hooks.visualization.enable = True
        hooks.visualization.interval = 1
        hooks.visualization.out_dir = osp.join(cfg.work_dir, show_dir)
        return
    hooks.visualization.draw = True
    if scope == 'mmseg':
        # mmseg's hook draws every interval-th test batch (50 by default:
        # a small test set got nothing) into the visualizer's save_dir,
        # which is relative to the current directory unless joined here.
        hooks.visualization.interval = 1
        cfg.visualizer.save_dir = osp.join(cfg.work_dir, show_dir)
    else:
        hooks.visualization.test_out_dir = show_dir


def main(argv=None):
    args = parse_args(argv)
    try:
        # What needs no unpickling is refused before the datasets load;
        # the rest (non-finite tensors, refused types) as the runner loads
        # it.
        probe_checkpoint_file(args.checkpoint)
        cfg = build_cfg(args)
    except (CheckpointError, FileNotFoundError, KeyError, ValueError) as exc:
        # A KeyError's str() would quote its message.
        sys.exit(f'error: {exc.args[0] if isinstance(exc, KeyError) else exc}')
    try:
        with checked_checkpoint_loading():
            run_runner(cfg, 'test')
    except CheckpointError as exc:
        sys.exit(f'error: {exc}')


def build_cfg(args) -> Config:
    """The config with test.py's options applied; raises naming the option
    or key that cannot apply."""
    cfg = load_config(args.config, args.cfg_options, args.launcher,
                      args.work_dir)
    # The backbone's ImageNet init is not needed: the checkpoint has it all.
    cfg.load_from = args.checkpoint
    # mmengine loads it with strict=False: a file that is not this model's
    # would be tested as an initialised model.
    cfg.custom_hooks = [
        *cfg.get('custom_hooks', []),
        dict(type='CheckpointMatchHook', checkpoint=args.checkpoint)
    ]
    if args.show_dir:
        enable_visualization(cfg, args.show_dir)
    if args.out:
        scope = cfg.get('default_scope')
        if scope == 'mmseg':
            raise ValueError('--out is for detection and classification '
                             'configs')
        if not args.out.endswith(('.pkl', '.pickle')):
            raise ValueError(f'--out {args.out}: must end in .pkl')
        cfg.test_evaluator = [
            cfg.test_evaluator
        ] if not isinstance(cfg.test_evaluator, list) else cfg.test_evaluator
        # mmdet's dumper keeps its result format; mmpretrain's test.py
        # uses mmengine's DumpResults (one dict per image).
        dumper = 'DumpResults' if scope == 'mmpretrain' else 'DumpDetResults'
        cfg.test_evaluator.append(dict(type=dumper, out_file_path=args.out))
    return cfg


if __name__ == '__main__':
    main()
