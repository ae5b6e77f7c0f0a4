# Copyright (c) kcla_mm contributors. Licensed under the Apache License 2.0.
"""kcla_mm's model index: model names -> config file (+ released weights).

The index is OpenMMLab's ``model-index.yml`` (a list of ``Import``-ed
``metafile.yml``), shipped as mmdet does under the package's ``.mim/``
folder (created by setup.py: links in an editable install, copies in a wheel
or sdist). The folder is found as mmengine's inferencers find their scope
package's (``BaseInferencer._get_repo_or_mim_dir``). mmengine's inferencers
look up names only in their scope package's index (mmdet's for
``DetInferencer``), and its metafile reader
(``BaseInferencer._get_models_from_metafile``) yields bare entries: it does
not say which metafile an entry came from and checks nothing (an ``Import``
that does not exist fails with a bare ``FileNotFoundError``, a ``Config``
that does not exist only when the model is used, a repeated name goes
unnoticed). So this module reads the index itself, checking each entry.
"""
import os.path as osp
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from mmengine.fileio import load
from mmengine.infer import BaseInferencer


@dataclass
class ModelInfo:
    """One ``Models`` entry of a metafile.

    Attributes:
        name (str): ``Name``, the id for inference and ``mim download``.
        config (str): Absolute path of the config file.
        weights (str, optional): ``Weights`` URL or path; None for a model
            without released weights.
        metafile (str): The metafile that lists the model.
        aliases (list[str]): ``Alias`` names, if any.
        results (list[dict]): ``Results`` as written in the metafile.
    """
    name: str
    config: str
    weights: Optional[str]
    metafile: str
    aliases: List[str] = field(default_factory=list)
    results: List[dict] = field(default_factory=list)


def index_dir(package: str = 'kcla_mm') -> str:
    """The folder holding ``package``'s ``model-index.yml`` and ``configs/``.

    As mmengine's inferencers find it: the repository root when the package
    is imported from a source checkout (a ``configs/`` folder beside the
    package), else the installed ``<package>/.mim``.

    Raises:
        FileNotFoundError: that folder has no ``model-index.yml``.
    """
    try:
        root = BaseInferencer._get_repo_or_mim_dir(package)
    except FileNotFoundError:
        root = None
    if root is None or not osp.isfile(osp.join(root, 'model-index.yml')):
        raise FileNotFoundError(
            f'{package} has no model-index.yml beside its configs/ (in '
            f'{package}/.mim or the repository root); reinstall it (pip '
            f'install -e . creates {package}/.mim)')
    return root


def load_model_index(package: str = 'kcla_mm') -> Dict[str, ModelInfo]:
    """All models of ``package``'s model index, by lower-case name.

    Raises:
        ValueError: a metafile entry lacks ``Name`` or ``Config``, names a
            config that does not exist, or repeats a name.
    """
    root = index_dir(package)
    index_file = osp.join(root, 'model-index.yml')
    index = load(index_file) or {}
    models: Dict[str, ModelInfo] = {}
    for relative in index.get('Import') or []:
        metafile = osp.join(root, relative)
        if not osp.isfile(metafile):
            raise ValueError(f'{index_file} imports {relative}, which does '
                             f'not exist ({metafile})')
        for i, entry in enumerate((load(metafile) or {}).get('Models') or []):
            where = f'{metafile}: Models[{i}]'
            for key in ('Name', 'Config'):
                if not entry.get(key):
                    raise ValueError(f'{where} has no {key!r}')
            config = osp.join(root, entry['Config'])
            if not osp.isfile(config):
                raise ValueError(f"{where} ({entry['Name']}): Config "
                                 f"{entry['Config']} does not exist")
            weights = entry.get('Weights')
            if isinstance(weights, list):
                weights = weights[0] if weights else None
            aliases = entry.get('Alias') or []
            aliases = [aliases] if isinstance(aliases, str) else list(aliases)
            info = ModelInfo(
                name=entry['Name'],
                config=config,
                weights=weights,
                metafile=metafile,
                aliases=aliases,
                results=list(entry.get('Results') or []))
            for key in [info.name, *info.aliases]:
                if key.lower() in models:
                    raise ValueError(f'{where}: the name {key!r} is '
                                     'already used by another model')
                models[key.lower()] = info
    return models


def get_model_info(name: str, package: str = 'kcla_mm') -> ModelInfo:
    """The model called ``name`` (or with that alias) in ``package``'s index.

    Raises:
        ValueError: no such model; the message lists the known names.
    """
    models = load_model_index(package)
    info = models.get(name.lower())
    if info is None:
        known = sorted({m.name for m in models.values()})
        raise ValueError(f'{name!r} is not a model of {package}; known '
                         f"models: {', '.join(known) or 'none'}")
    return info


def find_model(name: str, package: str = 'kcla_mm') -> Optional[ModelInfo]:
    """Like :func:`get_model_info`, but None for an unknown name."""
    return load_model_index(package).get(name.lower())
