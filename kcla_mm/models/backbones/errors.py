# Copyright (c) kcla_mm contributors. Licensed under the Apache License 2.0.
"""Argument errors of the layer-attention backbones.

Each names the offending field, as a ValueError, and is also an instance of
the exception that mmdet's and mmseg's ``ResNet`` raise for the same input
(``KeyError`` for an unknown ``depth`` or norm type, ``AssertionError`` for
``num_stages`` out of range or ``strides`` / ``dilations`` of the wrong
length, ``TypeError`` for a value of the wrong kind, ``IndexError`` for a
``multi_grid`` shorter than the last stage, ``AttributeError`` for a
``frozen_stages`` beyond the last stage), so that code written against
either kind of caller keeps working.
"""


class BackboneKeyError(ValueError, KeyError):
    """A field value that mmdet's / mmseg's ResNet rejects with KeyError
    (an unknown ``depth``, a ``norm_cfg`` / ``conv_cfg`` without a known
    ``type``)."""

    def __str__(self) -> str:
        # KeyError's __str__ would quote the message as a key.
        return ValueError.__str__(self)


class BackboneAssertionError(ValueError, AssertionError):
    """A field value that mmdet's / mmseg's ResNet rejects with an
    assertion (``num_stages``, the lengths of ``strides`` and
    ``dilations``, ``out_indices``)."""


class BackboneTypeError(ValueError, TypeError):
    """A field value of the wrong kind (a string for a number or a flag, a
    number for a sequence), which mmdet's / mmseg's ResNet would reject
    with TypeError, or take silently."""


class BackboneIndexError(ValueError, IndexError):
    """A ``multi_grid`` without one dilation per block of the last stage
    (mmseg's ResNet indexes it per block: IndexError when it is short)."""


class BackboneAttributeError(ValueError, AttributeError):
    """A ``frozen_stages`` outside -1..num_stages (mmdet's / mmseg's ResNet
    look for a ``layer{num_stages + 1}`` to freeze: AttributeError)."""
