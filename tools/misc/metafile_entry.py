"""Print OpenMMLab metafile ``Models`` entries for configs, measured.

    python tools/misc/metafile_entry.py CONFIG [CONFIG ...] --collection NAME
        [--shape H W]

For each config: ``Name`` (the file name), ``In Collection``, ``Config``
(relative to the repository) and ``Metadata`` read from the config (task,
training data, epochs or iterations, crop size, backbone) plus
``Parameters`` and ``FLOPs`` measured as tools/analysis/get_flops.py
measures them, at its default input shape (detection 1280x800,
segmentation the crop size) or ``--shape``. No ``Results`` and no
``Weights``: add those only for a trained and published model. Paste the
output under ``Models:`` of a metafile that model-index.yml imports. The
entries are :func:`kcla_mm.model_zoo.metafile.metafile_entry`'s.
"""
import argparse
import os.path as osp

import yaml

from kcla_mm.model_zoo.metafile import metafile_entry

# The repository (or an installed package's .mim folder): where
# model-index.yml is, and what metafile Config paths are relative to.
ROOT = osp.abspath(osp.join(osp.dirname(__file__), '..', '..'))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('configs', nargs='+')
    parser.add_argument('--collection', required=True)
    parser.add_argument('--shape', type=int, nargs=2, metavar=('H', 'W'))
    args = parser.parse_args(argv)
    for config in args.configs:
        entry = metafile_entry(config, args.collection, ROOT, args.shape)
        text = yaml.safe_dump([entry], sort_keys=False, width=79)
        print('\n'.join('  ' + line for line in text.splitlines()) + '\n')


if __name__ == '__main__':
    main()
