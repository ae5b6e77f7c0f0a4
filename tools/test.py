"""Test a trained detector or segmentor (mmdet/mmseg style).

    python tools/test.py CONFIG CHECKPOINT [--work-dir DIR] [--out FILE]
        [--show-dir DIR] [--cfg-options data_root=PATH KEY=VALUE ...]
        [--launcher none|pytorch|slurm|mpi]

CHECKPOINT may be a training checkpoint of tools/train.py: it is loaded
with weights_only=True, with mmengine's logging types allow-listed.
"""
import argparse
import os.path as osp
import sys

from mmengine.config import Config
from mmengine.registry import RUNNERS
from mmengine.runner import Runner

sys.path.insert(0, osp.join(osp.dirname(osp.abspath(__file__)), '..'))

import kcla_mm  # noqa: E402,F401  registers KCLA modules in mmdet and mmseg
from kcla_mm.engine import (add_runner_arguments,  # noqa: E402
                            close_distributed,
                            export_local_rank,
                            init_distributed_on_cpu, load_config)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description='Test a model')
    parser.add_argument('config', help='test config file path')
    parser.add_argument('checkpoint', help='checkpoint file')
    parser.add_argument('--work-dir', help='the dir to save the metrics')
    parser.add_argument(
        '--out', help='dump the raw predictions to this pickle file '
        '(detection configs)')
    parser.add_argument(
        '--show-dir', help='save images with predictions drawn to this '
        'directory (relative to the work dir\'s timestamped folder)')
    add_runner_arguments(parser)
    args = parser.parse_args(argv)
    export_local_rank(args)
    return args


def enable_visualization(cfg: Config, show_dir: str) -> None:
    hooks = cfg.default_hooks
    if 'visualization' not in hooks:
        raise KeyError('--show-dir needs default_hooks.visualization in the '
                       'config')
    hooks.visualization.draw = True
    if cfg.get('default_scope') == 'mmseg':
        cfg.visualizer.save_dir = show_dir
    else:
        hooks.visualization.test_out_dir = show_dir


def main(argv=None):
    args = parse_args(argv)
    if not osp.isfile(args.checkpoint):
        raise FileNotFoundError(f'checkpoint {args.checkpoint}: no such file')
    cfg = load_config(args.config, args.cfg_options, args.launcher,
                      args.work_dir)
    # The backbone's ImageNet init is not needed: the checkpoint has it all.
    cfg.load_from = args.checkpoint
    if args.show_dir:
        enable_visualization(cfg, args.show_dir)
    if args.out:
        if cfg.get('default_scope') == 'mmseg':
            raise ValueError('--out is for detection configs')
        if not args.out.endswith(('.pkl', '.pickle')):
            raise ValueError(f'--out {args.out}: must end in .pkl')
        cfg.test_evaluator = [cfg.test_evaluator] if not isinstance(
            cfg.test_evaluator, list) else cfg.test_evaluator
        cfg.test_evaluator.append(
            dict(type='DumpDetResults', out_file_path=args.out))
    init_distributed_on_cpu(cfg)
    try:
        runner = (Runner.from_cfg(cfg)
                  if 'runner_type' not in cfg else RUNNERS.build(cfg))
        runner.test()
    finally:
        close_distributed()


if __name__ == '__main__':
    main()
