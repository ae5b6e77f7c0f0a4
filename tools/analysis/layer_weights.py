"""What KCLA's layers attend to, next to MRLA-light's decaying contributions.

    python tools/analysis/layer_weights.py CONFIG CHECKPOINT IMAGE
        [--out layer_weights.png] [--size 224] [--heads 2]
        [--mrla-light-checkpoint PATH]

CONFIG has a KCLA backbone (a detection or UNet config, or a config with
a top-level ``backbone`` dict). CHECKPOINT is a training
checkpoint of that model or a backbone state dict; ``none`` (or
``--random-init``) runs a randomly initialised model, and the plot title
says so. For every block t the heat map shows the normalised weight
w_i / Z_t with which each earlier block i enters KCLA's aggregate, per head
(mean over heads and ``--heads`` single heads), beside the same picture for
MRLA-light of the same depth and width: the share of block i in O^t, whose
effective coefficient gate_i * prod lambda decays geometrically with t - i.
MRLA-light is randomly initialised unless ``--mrla-light-checkpoint`` is given.
Colours are on a log scale; rows sum to 1.
"""
import argparse
import logging
import os
import os.path as osp
import sys
from typing import Optional

import numpy as np
import torch
from mmengine.config import DictAction
from mmengine.logging import MMLogger

from kcla_mm.analysis.layer_contributions import (kcla_normalised_weights,
                                                  mrla_light_shares)
from kcla_mm.analysis.model_loading import (config_and_backbone,
                                            describe_weights, load_backbone,
                                            read_image)
from kcla_mm.utils.checkpoint_loading import CheckpointError

# KCLA-only options that MRLA-light does not take.
KCLA_ONLY = ('temperature_range', 'clamp', 'kcla_drop_path', 'renorm_blocks')


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('config')
    parser.add_argument('checkpoint', help="checkpoint file, or 'none'")
    parser.add_argument('image')
    parser.add_argument(
        '--random-init',
        action='store_true',
        help='ignore CHECKPOINT: randomly initialised model')
    parser.add_argument(
        '--mrla-light-checkpoint',
        default=None,
        help='MRLALightResNet weights of the same depth/width')
    parser.add_argument('--out', default='layer_weights.png')
    parser.add_argument('--size', type=int, default=224)
    parser.add_argument(
        '--heads',
        type=int,
        default=2,
        help='single heads to plot besides the mean')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction)
    return parser.parse_args(argv)


def as_matrix(rows, head=None):
    """Lower-triangular (T, T) matrix; ``head`` indexes the last stage's
    heads (followed back through the adaptation lineage), None = mean."""
    t = len(rows)
    matrix = np.full((t, t), np.nan)
    final_heads = rows[-1].shape[0]
    for i, row in enumerate(rows):
        if head is None:
            values = row.mean(0)
        else:
            values = row[head * row.shape[0] // final_heads]
        matrix[i, :i + 1] = values.numpy()
    return matrix


def summary(name, rows):
    last = rows[-1].mean(0).double()
    effective = 1 / (last**2).sum()
    half = len(last) // 2
    return (f'{name}: at the last block (mean over heads) block 0 weighs '
            f'{last[0]:.2e}, the first {half} blocks together '
            f'{last[:half].sum():.3f}; effective number of blocks '
            f'1/sum(share^2) = {effective:.1f} of {len(last)}')


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
    cfg, kcla_cfg = config_and_backbone(args.config, 'KCLAResNet',
                                        args.cfg_options)
    checkpoint = checkpoint_arg(args)
    mrla_light_cfg = {k: v for k, v in kcla_cfg.items() if k not in KCLA_ONLY}
    mrla_light_cfg['type'] = 'MRLALightResNet'
    try:
        kcla = load_backbone(cfg, checkpoint, kcla_cfg)
        mrla_light = load_backbone(cfg, args.mrla_light_checkpoint,
                                   mrla_light_cfg)
    except CheckpointError as exc:  # one line naming the file
        sys.exit(f'error: {exc}')
    x = read_image(args.image, args.size, cfg)

    panels = [('KCLA  w_i / Z_t', kcla_normalised_weights(kcla, x),
               describe_weights(checkpoint)),
              ('MRLA-light  share of block i in O^t',
               mrla_light_shares(mrla_light, x),
               describe_weights(args.mrla_light_checkpoint))]

    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    from matplotlib.colors import LogNorm
    from matplotlib.ticker import MaxNLocator
    final_heads = min(rows[-1].shape[0] for _, rows, _ in panels)
    heads = sorted(
        set(np.linspace(
            0, final_heads -
            1, args.heads).round().astype(int))) if args.heads > 0 else []
    columns = [None] + list(heads)
    fig, axes = plt.subplots(
        2, len(columns), figsize=(3.6 * len(columns) + 1, 7.2), squeeze=False)
    norm = LogNorm(vmin=1e-4, vmax=1)
    for r, (title, rows, weights) in enumerate(panels):
        for c, head in enumerate(columns):
            ax = axes[r, c]
            image = ax.imshow(
                np.clip(as_matrix(rows, head), 1e-4, 1),
                norm=norm,
                cmap='viridis')
            label = 'mean over heads' if head is None else f'head {head}'
            ax.set_title(f'{title}\n{label} ({weights})', fontsize=9)
            ax.set_xlabel('earlier block i')
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.yaxis.set_major_locator(MaxNLocator(integer=True))
            ax.set_ylabel('block t')
        fig.colorbar(image, ax=axes[r].tolist(), shrink=0.8)
    depth = kcla_cfg.get('depth')
    fig.suptitle(
        f'Layer weights, ResNet-{depth}, {osp.basename(args.image)}'
        f' at {args.size}x{args.size}, KCLA: '
        f'{describe_weights(checkpoint)}',
        fontsize=11)
    out_dir = osp.dirname(osp.abspath(args.out))
    os.makedirs(out_dir, exist_ok=True)
    fig.savefig(args.out, dpi=80)
    plt.close(fig)
    for title, rows, _ in panels:
        print(summary(title.split()[0], rows))
    print(f'wrote {args.out}')


if __name__ == '__main__':
    main()
