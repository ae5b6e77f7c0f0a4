# Copyright (c) kcla_mm contributors. Licensed under the Apache License 2.0.
"""A residual block's add and ReLU, and the KCLA layer's plane means after
it, in one pass in a train step.

The block ends in ``ReLU(Norm(conv(.)) + identity)``, which eager PyTorch
runs as an add and a ReLU over the block-sized result (both in place). The
layer then reads the result once more for the plane means of its pooled
vectors. In backward, autograd adds the means' broadcast gradient to the
gradient of the result (one pass), then the ReLU's backward writes a new
block-sized tensor (another pass and an allocation). :class:`AddReLUMeans`
does the forward in one pass, written over the norm's output as the
block's in-place add would, and the backward in one pass, written over the
gradient it receives where nothing else holds that
(:func:`.reusable_gradients`).

It runs in a train step where the block's body runs as its class's
forward does, but module by module (:func:`block_with_fused_tail`, or
:func:`.block_with_recomputed_input` with its recomputing convs): one of
mmdet's or mmseg's plain blocks exactly, without plugins or ``with_cp``,
no global module hooks, not under torch.compile nor while exporting; and
where the block's ReLU is a plain ``nn.ReLU`` without hooks, the layer has
no hooks (it is not called as a module) and its call runs the compiled
kernels' recomputing node (:func:`.select_implementation` and
:func:`.replayable`). Everything else runs the block as a module, or adds,
applies the block's ReLU and calls the layer. The layer's output is the
same either way up to the rounding of the plane means (summed in float
blocks added in double, as the kernels' other sums); tested in
tests/test_train_tail.py.
"""
from typing import TYPE_CHECKING, Optional, Tuple

import torch
import torch.nn as nn
from torch import Tensor
from torch.nn.modules import module as module_hooks

from ....torch_compat import is_compiling, is_exporting
from .block_tail import (BOTTLENECKS, KNOWN_BLOCKS, calls_layer_directly,
                         has_hooks)
from .compiled import compiled_pooled, compiled_update, extension
from .dispatch import select_implementation
from .gradient_reuse import reusable_gradients
from .params import KCLAParams
from .recompute import (differentiable_once, recomputed_forward, replayable,
                        saved)
from .state import KCLAState

if TYPE_CHECKING:  # pragma: no cover
    from .layer import KCLALayer


class AddReLUMeans(torch.autograd.Function):
    """(pre, identity) -> (x, means): ``x = ReLU(pre + identity)``
    written over ``pre`` and its plane means (N, C) in ``x``'s dtype, as
    ``spatial_mean`` gives them. Keeps ``x``, which the layer's node keeps
    too."""

    @staticmethod
    def forward(ctx, pre: Tensor, identity: Tensor) -> Tuple[Tensor, Tensor]:
        x, means = extension().add_relu_means(pre, identity)
        ctx.mark_dirty(x)
        ctx.save_for_backward(x)
        return x, means

    @staticmethod
    def backward(ctx, grad_x: Tensor, grad_means: Tensor):
        # First, before this frame takes more references to it.
        reuse, = reusable_gradients(grad_x)
        differentiable_once('AddReLUMeans')
        x, = saved(ctx)
        grad = extension().add_relu_means_backward(grad_x.contiguous(),
                                                   grad_means.contiguous(), x,
                                                   grad_x if reuse else None)
        needs = ctx.needs_input_grad
        return grad if needs[0] else None, grad if needs[1] else None


def train_tail_fuses(layer: 'KCLALayer', relu: nn.Module, pre: Tensor,
                     identity: Tensor, state: Optional[KCLAState],
                     params: KCLAParams) -> bool:
    """Whether :func:`block_tail_and_layer` runs :class:`AddReLUMeans`
    (module docstring); ``pre`` stands for the block's result, whose
    device, dtype, layout and shape it has."""
    return (type(relu) is nn.ReLU and not has_hooks(relu)
            and not has_hooks(layer) and not pre._is_view()
            and identity.shape == pre.shape and identity.dtype == pre.dtype
            and identity.is_contiguous() and select_implementation(
                layer.implementation, params, pre, state) == 'compiled'
            and replayable(params, pre, state))


def block_tail_and_layer(
        layer: 'KCLALayer', relu: nn.Module, pre: Tensor, identity: Tensor,
        state: Optional[KCLAState]) -> Tuple[Tensor, KCLAState]:
    """``layer(relu(pre + identity), state)`` for a block whose last norm
    gave ``pre``, with the add, the ReLU and the layer's plane means in
    :class:`AddReLUMeans` where :func:`train_tail_fuses`."""
    params = layer.params()
    if not train_tail_fuses(layer, relu, pre, identity, state, params):
        pre += identity
        return layer(relu(pre), state)
    x, means = AddReLUMeans.apply(pre, identity)
    layer.last_implementation = 'compiled'
    return recomputed_forward(
        params,
        x,
        state,
        update=compiled_update,
        means=means,
        pooled=compiled_pooled)


def runs_body(block: nn.Module, layer: 'KCLALayer') -> bool:
    """Whether :func:`block_with_fused_tail` may run ``block``'s body
    module by module in a train step (module docstring), and then
    ``layer`` without calling it as a module: not wrapped
    (:func:`.calls_layer_directly`) and without hooks (FSDP2's unshard is
    one)."""
    return (torch.is_grad_enabled() and type(block) in KNOWN_BLOCKS
            and calls_layer_directly(block, layer) and not has_hooks(layer)
            and not getattr(block, 'with_plugins', False) and not block.with_cp
            and not module_hooks._global_forward_hooks
            and not module_hooks._global_forward_pre_hooks
            and not is_compiling() and not is_exporting())


def block_with_fused_tail(
        block: nn.Module, layer: 'KCLALayer', x: Tensor,
        state: Optional[KCLAState]) -> Optional[Tuple[Tensor, KCLAState]]:
    """``layer(block(x), state)`` with the block's body run module by
    module and its end through :func:`block_tail_and_layer`, where
    :func:`runs_body` and the layer's call on the block's input would run
    the compiled kernels (checked again on the block's result); None
    (nothing run) elsewhere."""
    if not runs_body(block, layer) or select_implementation(
            layer.implementation, layer.params(), x, state) != 'compiled':
        return None
    # The block's forward (mmdet's and mmseg's alike), without plugins.
    out = block.relu(block.norm1(block.conv1(x)))
    if isinstance(block, BOTTLENECKS):
        out = block.relu(block.norm2(block.conv2(out)))
        out = block.norm3(block.conv3(out))
    else:
        out = block.norm2(block.conv2(out))
    identity = x if block.downsample is None else block.downsample(x)
    return block_tail_and_layer(layer, block.relu, out, identity, state)
