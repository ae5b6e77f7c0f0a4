# Copyright (c) kcla_mm contributors. Licensed under the Apache License 2.0.
"""mmdet's ``DetInferencer`` and mmseg's ``MMSegInferencer`` that also know
kcla_mm's model names.

mmengine's ``BaseInferencer`` resolves a model *name* only in the model
index of its scope package (``mmdet`` for ``DetInferencer``), and the scope
must stay mmdet/mmseg for the registries; mmengine has no public way to
name another package's index. These subclasses resolve a name of kcla_mm's
index (see :mod:`kcla_mm.model_zoo.model_index`) to its Config and weights
before handing them to the parents' constructors; any other string (a
config path, an mmdet or mmseg model name) and a Config object go through
unchanged, to the parents' own lookup. No private method is overridden. Their
weights load through :func:`kcla_mm.utils.checkpoint_loading.load_checkpoint`
(a bad file raises :class:`~kcla_mm.utils.checkpoint_loading.CheckpointError`
naming it; NaN/Inf tensors are refused).
"""
import os.path as osp
import warnings
from typing import Optional, Tuple, Union

from mmdet.apis import DetInferencer
from mmengine.config import Config
from mmseg.apis import MMSegInferencer

from ..model_zoo.model_index import find_model, get_model_info
from ..utils.checkpoint_loading import checked_checkpoint_loading


def _from_index(model, weights: Optional[str],
                package: str) -> Tuple[object, Optional[str]]:
    """(model, weights) for the parent inferencer: a model name of
    ``package``'s index becomes its Config and (unless ``weights`` is
    given) its ``Weights``; anything else is returned as it is."""
    if not isinstance(model, str) or osp.isfile(model):
        return model, weights
    info = find_model(model, package)
    if info is None:
        return model, weights
    if weights is None:
        weights = info.weights
        if weights is None:
            warnings.warn(f'{info.name} has no released weights in the '
                          f'{package} model index: pass weights=CHECKPOINT, '
                          'or the model keeps its initialisation')
    return Config.fromfile(info.config), weights


class KCLADetInferencer(DetInferencer):
    """:class:`mmdet.apis.DetInferencer` that resolves kcla_mm model names.

    Args:
        model (str | Config, optional): A config file, a Config, or a model
            name of ``package``'s model index (or of mmdet's).
        weights (str, optional): Checkpoint path or URL. Defaults to the
            model index's ``Weights`` of a named model.
        package (str): The package whose ``model-index.yml`` names are
            resolved. Defaults to ``'kcla_mm'``.
        **kwargs: The other arguments of ``DetInferencer`` (``device``,
            ``scope``, ``palette``, ``show_progress``).
    """

    def __init__(self,
                 model=None,
                 weights: Optional[str] = None,
                 package: str = 'kcla_mm',
                 **kwargs) -> None:
        self.index_package = package
        model, weights = _from_index(model, weights, package)
        with checked_checkpoint_loading():
            super().__init__(model=model, weights=weights, **kwargs)


class KCLASegInferencer(MMSegInferencer):
    """:class:`mmseg.apis.MMSegInferencer` that resolves kcla_mm model
    names; arguments as :class:`KCLADetInferencer` (plus mmseg's
    ``classes``, ``palette``, ``dataset_name``)."""

    def __init__(self,
                 model,
                 weights: Optional[str] = None,
                 package: str = 'kcla_mm',
                 **kwargs) -> None:
        self.index_package = package
        model, weights = _from_index(model, weights, package)
        with checked_checkpoint_loading():
            super().__init__(model=model, weights=weights, **kwargs)


def resolve_model(model: str,
                  weights: Optional[str] = None,
                  package: str = 'kcla_mm') -> Tuple[str, Optional[str]]:
    """(config file, weights) for a config path or a model name.

    An explicit ``weights`` wins over the model index's ``Weights``.

    Raises:
        ValueError: ``model`` is neither a file nor a known model name.
    """
    if osp.isfile(model):
        return model, weights
    try:
        info = get_model_info(model, package)
    except ValueError as exc:
        raise ValueError(f'{model} is neither a config file nor a model '
                         f'name: {exc}') from None
    return info.config, weights if weights is not None else info.weights


def init_inferencer(model: Union[str, Config],
                    weights: Optional[str] = None,
                    device: Optional[str] = None,
                    package: str = 'kcla_mm',
                    cfg_options: Optional[dict] = None,
                    **kwargs) -> Union[KCLADetInferencer, KCLASegInferencer]:
    """The detection or segmentation inferencer of a kcla_mm model.

    The config's ``default_scope`` (``mmdet`` or ``mmseg``) picks
    :class:`KCLADetInferencer` or :class:`KCLASegInferencer`.

    Args:
        model (str | Config): Config file, model name, or Config.
        weights (str, optional): Checkpoint path or URL (default: the model
            index's ``Weights`` of a named model).
        device (str, optional): e.g. ``'cpu'``. Defaults to the available
            device.
        package (str): Model index to resolve names in.
        cfg_options (dict, optional): Overrides merged into the config.
        **kwargs: Passed to the inferencer.

    Returns:
        KCLADetInferencer | KCLASegInferencer: The inferencer.
    """
    if isinstance(model, Config):
        cfg, source = model, 'the given Config'
    else:
        config_file, weights = resolve_model(model, weights, package)
        cfg, source = Config.fromfile(config_file), config_file
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    scope = cfg.get('default_scope')
    if scope == 'mmdet':
        cls = KCLADetInferencer
    elif scope == 'mmseg':
        cls = KCLASegInferencer
    else:
        raise ValueError(f"{source}: default_scope is {scope!r}; expected "
                         "'mmdet' or 'mmseg'")
    return cls(
        model=cfg, weights=weights, device=device, package=package, **kwargs)
