"""Cosine similarity of the keys across layers in standard layer attention.

    python tools/analysis/key_similarity.py CONFIG CHECKPOINT IMAGE
        [--out key_similarity.png] [--size 224]

CONFIG has an LA backbone (``LAResNet``, e.g. configs/baselines/
faster-rcnn_la-r50_fpn_1x_coco.py); CHECKPOINT is a training checkpoint of
it or a backbone state dict, or ``none`` (or ``--random-init``) for a
randomly initialised model, which the plot title then says. For the last
block of every stage the plot shows the cosine similarity matrix of all the
keys its softmax compares (every block so far, in that stage's key space),
computed per head and averaged over heads, and prints its mean
off-diagonal value: the KCLA paper's observation is that it is high.
"""
import argparse
import logging
import os
import os.path as osp
import sys
from typing import Optional

import torch
from mmengine.config import DictAction
from mmengine.logging import MMLogger

from kcla_mm.analysis.key_similarity import (la_key_similarity,
                                             mean_off_diagonal)
from kcla_mm.analysis.model_loading import (config_and_backbone,
                                            describe_weights, load_backbone,
                                            read_image)
from kcla_mm.utils.checkpoint_loading import CheckpointError


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('config')
    parser.add_argument('checkpoint', help="checkpoint file, or 'none'")
    parser.add_argument('image')
    parser.add_argument(
        '--random-init',
        action='store_true',
        help='ignore CHECKPOINT: randomly initialised model')
    parser.add_argument('--out', default='key_similarity.png')
    parser.add_argument('--size', type=int, default=224)
    parser.add_argument('--cfg-options', nargs='+', action=DictAction)
    return parser.parse_args(argv)


def checkpoint_arg(args: argparse.Namespace) -> Optional[str]:
    """The CHECKPOINT argument; None for a random init (``none``,
    ``random`` or ``--random-init``)."""
    if args.random_init or args.checkpoint.lower() in ('none', 'random'):
        return None
    return args.checkpoint


def main(argv=None):
    args = parse_args(argv)
    MMLogger.get_current_instance().setLevel(logging.WARNING)
    torch.manual_seed(0)
    cfg, la_cfg = config_and_backbone(args.config, 'LAResNet',
                                      args.cfg_options)
    checkpoint = checkpoint_arg(args)
    try:
        model = load_backbone(cfg, checkpoint, la_cfg)
    except CheckpointError as exc:  # one line naming the file
        sys.exit(f'error: {exc}')
    matrices = la_key_similarity(model, read_image(args.image, args.size, cfg))

    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator
    weights = describe_weights(checkpoint)
    fig, axes = plt.subplots(
        1, len(matrices), figsize=(3.6 * len(matrices) + 1, 4), squeeze=False)
    for s, (ax, matrix) in enumerate(zip(axes[0], matrices)):
        image = ax.imshow(matrix.numpy(), vmin=-1, vmax=1, cmap='RdBu_r')
        ax.set_title(
            f'keys at the end of stage {s + 1}\nmean off-diagonal '
            f'{mean_off_diagonal(matrix):.3f}',
            fontsize=9)
        ax.set_xlabel('block')
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel('block')
    fig.colorbar(image, ax=axes[0].tolist(), shrink=0.8)
    fig.suptitle(
        f'LA key cosine similarity (per head, mean over heads), '
        f'ResNet-{la_cfg.get("depth")}, {osp.basename(args.image)} '
        f'at {args.size}x{args.size}, {weights}',
        fontsize=10)
    os.makedirs(osp.dirname(osp.abspath(args.out)), exist_ok=True)
    fig.savefig(args.out, dpi=80, bbox_inches='tight')
    plt.close(fig)
    for s, matrix in enumerate(matrices):
        print(f'stage {s + 1}: {matrix.shape[0]} keys, mean off-diagonal '
              f'cosine similarity {mean_off_diagonal(matrix):.3f}')
    print(f'wrote {args.out}')


if __name__ == '__main__':
    main()
