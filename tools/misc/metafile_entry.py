"""Print OpenMMLab metafile ``Models`` entries for configs, measured.

    python tools/misc/metafile_entry.py CONFIG [CONFIG ...] --collection NAME
        [--shape H W]

For each config: ``Name`` (the file name), ``In Collection``, ``Config``
(relative to the repository) and ``Metadata`` read from the config (task,
training data, epochs or iterations, crop size, backbone) plus
``Parameters`` and ``FLOPs`` measured by tools/analysis/get_flops.py at its
default input shape (detection 1280x800, segmentation the crop size) or
``--shape``. No ``Results`` and no ``Weights``: add those only for a trained
and published model. Paste the output under ``Models:`` of a metafile that
model-index.yml imports.
"""
import argparse
import os.path as osp
import sys

import yaml
from mmengine.config import Config

ROOT = osp.abspath(osp.join(osp.dirname(__file__), '..', '..'))
sys.path.insert(0, ROOT)
sys.path.insert(0, osp.join(ROOT, 'tools', 'analysis'))

from get_flops import analyse, default_shape  # noqa: E402

DATASETS = {
    'CocoDataset': 'COCO',
    'ISIC2017Dataset': 'ISIC 2017',
    'ISIC2018Dataset': 'ISIC 2018',
    'KvasirSEGDataset': 'Kvasir-SEG',
}


def backbone_name(cfg: Config) -> str:
    backbone = cfg.model.backbone
    name = f"{backbone.type}-{backbone.get('depth', '')}".rstrip('-')
    extras = [f'{key} {backbone[key]}' for key in ('base_channels', 'head_dim')
              if key in backbone]
    return f"{name} ({', '.join(extras)})" if extras else name


def entry(config: str, collection: str, shape=None) -> dict:
    """The metafile entry of ``config`` with measured size and FLOPs."""
    cfg = Config.fromfile(config)
    scope = cfg.get('default_scope')
    dataset = cfg.train_dataloader.dataset
    while 'dataset' in dataset:  # RepeatDataset & co.
        dataset = dataset.dataset
    metadata = {}
    if scope == 'mmdet':
        metadata['Task'] = ('Instance Segmentation'
                            if 'mask_head' in cfg.model.get('roi_head', {})
                            else 'Object Detection')
    else:
        metadata['Task'] = 'Semantic Segmentation'
    metadata['Training Data'] = DATASETS.get(dataset.type, dataset.type)
    train_cfg = cfg.train_cfg
    if 'max_epochs' in train_cfg:
        metadata['Epochs'] = int(train_cfg.max_epochs)
    elif 'max_iters' in train_cfg:
        metadata['Iterations'] = int(train_cfg.max_iters)
    if scope == 'mmseg' and cfg.get('crop_size'):
        metadata['Crop Size'] = 'x'.join(map(str, cfg.crop_size))
    metadata['Backbone'] = backbone_name(cfg)
    height, width = shape or default_shape(cfg, scope)
    measured = analyse(cfg, height, width)
    metadata['Parameters'] = int(measured['params'])
    metadata['FLOPs'] = int(measured['flops'])
    metadata['FLOPs Input Shape'] = f'1x3x{height}x{width}'
    return {
        'Name': osp.splitext(osp.basename(config))[0],
        'In Collection': collection,
        'Config': osp.relpath(osp.abspath(config), ROOT),
        'Metadata': metadata,
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('configs', nargs='+')
    parser.add_argument('--collection', required=True)
    parser.add_argument('--shape', type=int, nargs=2, metavar=('H', 'W'))
    args = parser.parse_args(argv)
    for config in args.configs:
        text = yaml.safe_dump([entry(config, args.collection, args.shape)],
                              sort_keys=False, width=79)
        print('\n'.join('  ' + line for line in text.splitlines()) + '\n')


if __name__ == '__main__':
    main()
