"""Detect or segment images with a kcla_mm model and write the results drawn.

    python tools/infer.py INPUTS MODEL [--weights CHECKPOINT] [--out-dir DIR]
        [--pred-score-thr 0.3] [--device cpu] [--cfg-options KEY=VALUE ...]

INPUTS is an image file or a folder of images. MODEL is a config file or a
model name of kcla_mm's model index (``mim search kcla_mm``); a name without
``--weights`` uses the index's released weights, and is refused where the
index has none. The config's
``default_scope`` picks mmdet's ``DetInferencer`` or mmseg's
``MMSegInferencer`` (see ``kcla_mm.apis``). Results go where those
inferencers put them: ``DIR/vis/`` (images with the predictions drawn) and
``DIR/preds/`` (detection, one json per image, named after it) or
``DIR/pred/`` (segmentation, one mask png per image: ``NAME_pred.png`` for
an image ``NAME.jpg``; mmseg's inferencer numbers them in the order it
read the folder, which this tool renames; a folder is read in name order).

CHECKPOINT may be a published checkpoint
(tools/model_converters/publish_model.py) or a training checkpoint of
tools/train.py; both load with weights_only=True. A file that is missing,
truncated, not a checkpoint, or holds NaN/Inf tensors is refused in one line
(``error: CHECKPOINT: cause``, exit status 1).
"""
import argparse
import os
import os.path as osp
import sys
from typing import List

from mmengine.config import DictAction

from kcla_mm.apis import KCLADetInferencer, init_inferencer
from kcla_mm.model_zoo.model_index import find_model
from kcla_mm.utils.checkpoint_loading import (CheckpointError, is_local_path,
                                              probe_checkpoint_file)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('inputs', help='image file or folder of images')
    parser.add_argument('model', help='config file or kcla_mm model name')
    parser.add_argument(
        '--weights',
        default=None,
        help="checkpoint file or URL (default: the model index's Weights "
        'of a model name)')
    parser.add_argument(
        '--out-dir',
        default='outputs',
        help='output folder (vis/ and preds/ or pred/)')
    parser.add_argument('--device', default='cpu')
    parser.add_argument(
        '--pred-score-thr',
        '--score-thr',
        type=float,
        default=0.3,
        help='detection: draw boxes scoring at least this')
    parser.add_argument(
        '--package',
        default='kcla_mm',
        help='package whose model index resolves MODEL names')
    parser.add_argument(
        '--cfg-options',
        nargs='+',
        action=DictAction,
        help='override config settings, KEY=VALUE')
    return parser.parse_args(argv)


def image_files(inputs: str) -> List[str]:
    """An image, or the files of a folder in name order (mmengine lists a
    folder in the file system's order)."""
    if not osp.isdir(inputs):
        return [inputs]
    return sorted(
        osp.join(inputs, name) for name in os.listdir(inputs)
        if osp.isfile(osp.join(inputs, name)))


def name_masks_after_images(pred_dir: str, images: List[str]) -> None:
    """mmseg's ``{i:08d}_pred.png`` (the i-th image of one call) renamed
    ``NAME_pred.png`` after its image, as mmdet names its json files."""
    # In two steps: an image named 00000001.jpg must not overwrite the
    # second image's mask before it is renamed.
    moved = []
    for i, image in enumerate(images):
        numbered = osp.join(pred_dir, f'{i:08d}_pred.png')
        if osp.isfile(numbered):
            os.replace(numbered, numbered + '.renaming')
            moved.append((numbered + '.renaming', image))
    for source, image in moved:
        stem = osp.splitext(osp.basename(image))[0]
        os.replace(source, osp.join(pred_dir, f'{stem}_pred.png'))


def main(argv=None):
    args = parse_args(argv)
    if not osp.exists(args.inputs):
        raise FileNotFoundError(f'inputs {args.inputs}: no such file or '
                                'folder')
    info = (None if osp.isfile(args.model) else find_model(
        args.model, args.package))
    if info is not None and info.weights is None and args.weights is None:
        # The inferencer would only warn and draw an untrained model's
        # predictions.
        sys.exit(f'error: {info.name} has no released weights in the '
                 f'{args.package} model index: give --weights CHECKPOINT')
    try:
        if args.weights is not None and is_local_path(args.weights):
            probe_checkpoint_file(args.weights)
        inferencer = init_inferencer(
            args.model,
            weights=args.weights,
            device=args.device,
            package=args.package,
            cfg_options=args.cfg_options)
    except CheckpointError as exc:
        sys.exit(f'error: {exc}')
    if isinstance(inferencer, KCLADetInferencer):
        results = inferencer(
            args.inputs,
            out_dir=args.out_dir,
            no_save_pred=False,
            pred_score_thr=args.pred_score_thr)
        kept = sum(
            sum(score >= args.pred_score_thr for score in pred['scores'])
            for pred in results['predictions'])
        summary = (f'{kept} objects with score >= {args.pred_score_thr} in '
                   f"{len(results['predictions'])} image(s)")
    else:
        images = image_files(args.inputs)
        results = inferencer(images, out_dir=args.out_dir)
        name_masks_after_images(osp.join(args.out_dir, 'pred'), images)
        summary = f'{len(images)} segmentation mask(s)'
    vis_dir = osp.join(args.out_dir, 'vis')
    written = sorted(os.listdir(vis_dir)) if osp.isdir(vis_dir) else []
    print(f'{summary}; drawn to {vis_dir} ({len(written)} file(s))')


if __name__ == '__main__':
    main()
