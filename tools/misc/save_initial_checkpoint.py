"""Save a config's model as initialised, before any training step.

    python tools/misc/save_initial_checkpoint.py CONFIG OUT.pth

Testing this checkpoint with tools/test.py gives the untrained baseline that
a trained model's metrics should clearly beat.
"""
import argparse
import sys

import torch
from mmengine.config import Config, DictAction
from mmengine.registry import MODELS, init_default_scope

import kcla_mm  # noqa: F401
from kcla_mm.utils.cli import make_parent_dir
from kcla_mm.utils.config import pretrained_keys


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('config')
    parser.add_argument('out')
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--cfg-options', nargs='+', action=DictAction)
    args = parser.parse_args(argv)
    cfg = Config.fromfile(args.config)
    if args.cfg_options:
        cfg.merge_from_dict(args.cfg_options)
    init_default_scope(cfg.get('default_scope', 'mmdet'))
    torch.manual_seed(args.seed)
    model = MODELS.build(cfg.model)
    try:
        model.init_weights()
    except OSError as exc:
        # A config that starts from pretrained weights (init_cfg, or the
        # model's `pretrained`) that are not here: a missing file, or a
        # URL without a network.
        options = ' '.join(f'{key}=None'
                           for key in pretrained_keys(cfg.model, 'model'))
        sys.exit(f'error: {args.config}: its model initialises from '
                 f'weights that cannot be read here ({exc}); to save it '
                 f'without them: --cfg-options {options}')
    make_parent_dir(args.out)
    torch.save(
        dict(state_dict=model.state_dict(), meta=dict(seed=args.seed)),
        args.out)
    print(f'saved the initial weights of {args.config} to {args.out}')


if __name__ == '__main__':
    main()
