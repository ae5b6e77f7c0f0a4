"""Detect objects in one image and write it with the predictions drawn.

    python tools/infer.py CONFIG CHECKPOINT IMAGE --out FILE [--score-thr 0.3]

CHECKPOINT may be a training checkpoint of tools/train.py (loaded with
weights_only=True and mmengine's logging types allow-listed).
"""
import argparse
import os.path as osp
import sys

import mmcv
from mmdet.apis import inference_detector, init_detector
from mmdet.registry import VISUALIZERS
from mmengine.config import Config, DictAction

sys.path.insert(0, osp.join(osp.dirname(osp.abspath(__file__)), '..'))

import kcla_mm  # noqa: E402,F401  registers KCLA modules in mmdet and mmseg
from kcla_mm.engine import allow_mmengine_checkpoint_types  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('config')
    parser.add_argument('checkpoint')
    parser.add_argument('image')
    parser.add_argument('--out', required=True,
                        help='output image file (.jpg/.png)')
    parser.add_argument('--score-thr', type=float, default=0.3)
    parser.add_argument('--device', default='cpu')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction)
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    for field, path in (('config', args.config),
                        ('checkpoint', args.checkpoint),
                        ('image', args.image)):
        if not osp.isfile(path):
            raise FileNotFoundError(f'{field} {path}: no such file')
    cfg = Config.fromfile(args.config)
    if args.cfg_options:
        cfg.merge_from_dict(args.cfg_options)
    allow_mmengine_checkpoint_types()
    model = init_detector(cfg, args.checkpoint, device=args.device)
    result = inference_detector(model, args.image)
    visualizer = VISUALIZERS.build(model.cfg.visualizer)
    visualizer.dataset_meta = model.dataset_meta
    image = mmcv.imread(args.image, channel_order='rgb')
    visualizer.add_datasample(
        'prediction', image, data_sample=result, draw_gt=False, show=False,
        out_file=args.out, pred_score_thr=args.score_thr)
    kept = (result.pred_instances.scores >= args.score_thr).sum().item()
    print(f'{kept} objects with score >= {args.score_thr} drawn to {args.out}')


if __name__ == '__main__':
    main()
