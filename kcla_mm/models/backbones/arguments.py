# Copyright (c) kcla_mm contributors. Licensed under the Apache License 2.0.
"""Build-time checks of the backbones' arguments.

Every check names the config key as the user writes it (``kcla_drop_path``,
not the ``drop_path`` of the layer it is passed to), and fails at build
time what mmdet's and mmseg's ``ResNet`` would take silently (a negative
``out_indices``, a ``strides`` entry of 0), fail deep inside the build
without naming it (``frozen_stages=9``: no attribute ``layer5``), or only
show as ``loss: nan`` in training (``temperature_range=[0, 1]``). Where
upstream raises for the same input, the error is also of the type it
raises (:mod:`.errors`).
"""
import math
from numbers import Integral, Real
from typing import Callable, Optional, Sequence

import torch
from mmcv.cnn import build_conv_layer, build_norm_layer

from .errors import (BackboneAssertionError, BackboneAttributeError,
                     BackboneIndexError, BackboneKeyError, BackboneTypeError)

RESNET_STYLES = ('pytorch', 'caffe')
# The flags of mmdet's / mmseg's ResNet (the CIFAR layout and the attention
# backbones add theirs).
RESNET_FLAGS = ('deep_stem', 'avg_down', 'norm_eval', 'with_cp',
                'zero_init_residual')


def is_int(value) -> bool:
    """An integer, not a bool (``True`` is an int in Python)."""
    return isinstance(value, Integral) and not isinstance(value, bool)


def is_real(value) -> bool:
    """A real number, not a bool."""
    return isinstance(value, Real) and not isinstance(value, bool)


def check_flag(key: str, value) -> None:
    """``value`` is True or False (a string such as ``'False'`` is truthy
    and would switch the option on)."""
    if not (isinstance(value, bool) or (is_int(value) and value in (0, 1))):
        raise BackboneTypeError(f'{key}={value!r} must be True or False')


def check_positive_int(key: str, value, optional: bool = False) -> None:
    if optional and value is None:
        return
    if not is_int(value) or value < 1:
        none = ' (or None)' if optional else ''
        raise BackboneTypeError(
            f'{key}={value!r} must be a positive integer{none}')


def check_rate(key: str, value) -> None:
    """A drop-path rate: a number in [0, 1)."""
    if not is_real(value) or not 0. <= value < 1.:
        raise ValueError(f'{key}={value!r} must be in [0, 1)')


def check_int_sequence(key: str, value) -> tuple:
    """``value`` as a tuple of integers."""
    if (not isinstance(value, Sequence) or isinstance(value, str)
            or not all(is_int(v) for v in value)):
        raise BackboneTypeError(
            f'{key}={value!r} must be a sequence of integers')
    return tuple(value)


def check_temperature_range(key: str, value) -> None:
    """Two positive, finite numbers (low, high), low <= high, whose
    logarithms are finite in fp32: the per-head temperatures are the
    reciprocals of a log-uniform sequence between them (a 0 gives an
    infinite temperature, a negative number a NaN, and the model trains on
    ``loss: nan``)."""
    pair = tuple(value) if isinstance(
        value, Sequence) and not isinstance(value, str) else None
    if pair is None or len(pair) != 2 or not all(is_real(v) for v in pair):
        raise BackboneTypeError(
            f'{key}={value!r} must be two numbers (low, high), e.g. '
            '(0.7, 1 / 0.7)')
    low, high = pair
    if not all(math.isfinite(v) and v > 0 for v in pair):
        raise ValueError(
            f'{key}={value!r} must be two positive finite numbers: the '
            'head temperatures are the reciprocals of a log-uniform '
            'sequence between them')
    if low > high:
        raise ValueError(f'{key}={value!r} must be in increasing order '
                         f'(low, high): write ({high!r}, {low!r})')
    logs = torch.log(torch.tensor([float(low), float(high)]))
    if not torch.isfinite(logs).all():
        raise ValueError(
            f'{key}={value!r} is outside the positive finite range of '
            f'fp32 ({torch.finfo(torch.float32).tiny:g}..'
            f'{torch.finfo(torch.float32).max:g}), in which the layer '
            'computes the temperatures')


# exp(clamp) must be finite in fp32, in which the layer weights are kept.
MAX_CLAMP = math.log(torch.finfo(torch.float32).max)


def check_clamp(key: str, value) -> None:
    """The upper bound of ||K|| / tau before ``exp``: positive (at or below
    0 every layer weight is the constant exp(clamp)), and such that
    exp(clamp) is finite in fp32."""
    if not is_real(value) or not 0 < value < MAX_CLAMP:
        raise ValueError(
            f'{key}={value!r} must be a number in (0, {MAX_CLAMP:.2f}): '
            'the layer weights are exp(min(||K|| / tau, clamp)), kept in '
            'fp32')


def named_error(key: str, value, error: Exception) -> Exception:
    """``error`` as one that names ``key``: a ValueError of the same kind
    (the :mod:`.errors` classes for the kinds upstream raises)."""
    # KeyError's __str__ quotes its message.
    detail = error.args[0] if isinstance(error, KeyError) and len(
        error.args) == 1 else error
    message = f'{key}={value!r} cannot be built: {detail}'
    for kind, ours in ((KeyError, BackboneKeyError), (AssertionError,
                                                      BackboneAssertionError),
                       (TypeError, BackboneTypeError), (IndexError,
                                                        BackboneIndexError)):
        if isinstance(error, kind):
            return ours(message)
    return ValueError(message)


def check_layer_cfg(key: str, value, build: Callable, widths) -> None:
    """``build(value, width)`` succeeds for every width (a norm or conv
    config the blocks and the attention layers will be built from)."""
    if not isinstance(value, dict):
        # mmcv's build_*_layer raise TypeError('cfg must be a dict').
        raise BackboneTypeError(
            f"{key}={value!r} must be a dict with a 'type'")
    if 'type' not in value:
        # mmcv's build_*_layer raise KeyError for it.
        raise BackboneKeyError(f"{key}={value!r} must have a 'type'")
    for width in sorted(set(w for w in widths if w >= 1)):
        try:
            build(value, width)
        except Exception as error:
            raise named_error(key, value, error) from error


def check_resnet_args(cls_name: str, arch_settings: dict, depth,
                      kwargs: dict) -> None:
    """The options of mmdet's / mmseg's ``ResNet`` in ``kwargs`` (the
    defaults are theirs), checked before the build, each error naming its
    key (and, where upstream raises, also of upstream's type)."""
    if not isinstance(depth, Integral) or depth not in arch_settings:
        raise BackboneKeyError(f'depth={depth!r} is not supported by '
                               f'{cls_name}; choose from '
                               f'{sorted(arch_settings)}')
    num_stages = kwargs.get('num_stages', 4)
    if not is_int(num_stages):
        raise BackboneTypeError(
            f'num_stages={num_stages!r} must be an integer in 1..4')
    if not 1 <= num_stages <= 4:
        raise BackboneAssertionError(
            f'num_stages={num_stages} must be in 1..4')
    for field, default in (('strides', (1, 2, 2, 2)), ('dilations', (1, 1, 1,
                                                                     1))):
        value = kwargs.get(field, default)
        if (not isinstance(value, Sequence) or isinstance(value, str)):
            raise BackboneTypeError(
                f'{field}={value!r} must be a sequence of num_stages='
                f'{num_stages} positive integers')
        if len(value) != num_stages:
            raise BackboneAssertionError(
                f'{field}={tuple(value)} must have num_stages='
                f'{num_stages} entries, got {len(value)}')
        if not all(is_int(v) and v >= 1 for v in value):
            raise BackboneAssertionError(
                f'{field}={tuple(value)} must be positive integers')
    check_out_indices(kwargs.get('out_indices', (0, 1, 2, 3)), num_stages)
    check_frozen_stages(kwargs.get('frozen_stages', -1), num_stages)

    block, stage_blocks = arch_settings[depth]
    style = kwargs.get('style', 'pytorch')
    # Upstream, a Bottleneck asserts it with a bare AssertionError (which
    # this one still is) and a BasicBlock takes any string.
    if style not in RESNET_STYLES:
        raise BackboneAssertionError(
            f'style={style!r} must be one of {RESNET_STYLES}')
    for flag in RESNET_FLAGS:
        if flag in kwargs:
            check_flag(flag, kwargs[flag])
    for field in ('in_channels', 'base_channels'):
        if field in kwargs:
            check_positive_int(field, kwargs[field])
    check_positive_int(
        'stem_channels', kwargs.get('stem_channels'), optional=True)

    base = kwargs.get('base_channels', 64)
    stem = kwargs.get('stem_channels') or base
    widths = [stem // 2, stem] if kwargs.get('deep_stem') else [stem]
    for i in range(num_stages):
        widths += [base * 2**i, base * 2**i * block.expansion]
    if 'norm_cfg' in kwargs:
        check_layer_cfg('norm_cfg', kwargs['norm_cfg'], build_norm_layer,
                        widths)
    if kwargs.get('conv_cfg') is not None:
        check_layer_cfg(
            'conv_cfg', kwargs['conv_cfg'],
            lambda cfg, width: build_conv_layer(
                cfg, width, width, 3, padding=1, bias=False), [base])


def check_out_indices(out_indices, num_stages: int) -> None:
    """Distinct stage indices in 0..num_stages-1, in increasing order (the
    features come in stage order whatever the order written)."""
    if (not isinstance(out_indices, Sequence) or isinstance(out_indices, str)
            or not all(is_int(i) for i in out_indices)):
        raise BackboneTypeError(
            f'out_indices={out_indices!r} must be a sequence of stage '
            f'indices in 0..{num_stages - 1}')
    indices = tuple(out_indices)
    if not indices:
        raise BackboneAssertionError(
            f'out_indices={indices} must name at least one stage in '
            f'0..{num_stages - 1}')
    if max(indices) >= num_stages:
        raise BackboneAssertionError(
            f'out_indices={indices} must be below num_stages={num_stages} '
            f'(stages 0..{num_stages - 1})')
    if min(indices) < 0:
        raise BackboneAssertionError(
            f'out_indices={indices} must be in 0..num_stages-1='
            f'{num_stages - 1}: negative indices are not supported (the '
            'ResNet compares stage indices, so -1 would return no feature); '
            f'the last stage is {num_stages - 1}')
    if list(indices) != sorted(set(indices)):
        raise BackboneAssertionError(
            f'out_indices={indices} must be in increasing order without '
            f'repeats, e.g. {tuple(sorted(set(indices)))}: the features '
            'come in stage order, one per stage')


def check_frozen_stages(frozen_stages, num_stages: int) -> None:
    """-1 (nothing frozen), 0 (the stem) or k (the stem and stages 1..k),
    k <= num_stages."""
    if not is_int(frozen_stages):
        raise BackboneTypeError(
            f'frozen_stages={frozen_stages!r} must be an integer in '
            f'-1..num_stages={num_stages}')
    if not -1 <= frozen_stages <= num_stages:
        raise BackboneAttributeError(
            f'frozen_stages={frozen_stages} must be in -1..num_stages='
            f'{num_stages} (-1: nothing frozen, 0: the stem, k: the stem '
            'and stages 1..k)')


def check_multi_grid(multi_grid: Optional[Sequence[int]],
                     last_stage_blocks: int) -> None:
    """mmseg's ``multi_grid``: None, or one positive dilation per block of
    the last stage (mmseg's ResLayer reads ``multi_grid[i]`` for block i:
    a short one fails there, a long one is cut silently)."""
    if multi_grid is None:
        return
    grid = check_int_sequence('multi_grid', multi_grid)
    if len(grid) != last_stage_blocks or not all(d >= 1 for d in grid):
        raise BackboneIndexError(
            f'multi_grid={grid} must be {last_stage_blocks} positive '
            f'dilations, one per block of the last stage')
