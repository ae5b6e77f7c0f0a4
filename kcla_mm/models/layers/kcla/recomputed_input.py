# Copyright (c) kcla_mm contributors. Licensed under the Apache License 2.0.
"""The KCLA output as the next block reads it in a train step: recomputed
in backward by the convs that read it, instead of kept.

The layer's output ``X^t + branch`` is a new block-sized tensor, and the
next block's first conv (and its downsample conv, at the first block of a
stage) keep it for their weight gradients: that is the one block-sized
tensor per block that KCLA adds to what mmdet's ResNet keeps (the layer's
own node keeps ``X^t``, which the block's ReLU keeps too, and no state).
The kernels compute it again from ``X^t``, ``U^t`` (from the state tape)
and the per-channel statistics that the layer's node keeps, bit for bit
(``branch_output``): :func:`block_with_recomputed_input` runs the next
block with those convs as :class:`RecomputedInputConv` nodes, which keep
their weight and a :class:`KCLAOutput` instead of their input. The price
is one pass of the branch per layer in backward. On by default
(``KCLAResNet(kcla_recompute_outputs=True)``).

It applies where the block's input is the output of the compiled kernels'
train-step node (:class:`.CompiledUpdate`) and the block is one of mmdet's
or mmseg's plain ``BasicBlock`` / ``Bottleneck`` (or their cross-layer
versions) exactly, without plugins or ``with_cp``, with plain 2-D convs
where it reads ``x`` and no forward hooks on them (they are not called as
modules), nor global module hooks; not inside a process
group, where a wrapper (FSDP per block) may have sharded the previous
layer's parameters away until that layer's own backward, nor under
torch.compile or while exporting. Everything else runs the block as a
module. Tested in tests/test_recomputed_input.py.
"""
import weakref
from typing import TYPE_CHECKING, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor
from torch.nn.modules import module as module_hooks

from ....torch_compat import in_process_group, is_compiling, is_exporting
from ..profiling import phase
from .block_tail import BOTTLENECKS, KNOWN_BLOCKS, has_hooks, plain_conv
from .compiled import CompiledUpdate, extension
from .recompute import differentiable_once, saved
from .state import KCLAState
from .train_tail import block_tail_and_layer

if TYPE_CHECKING:  # pragma: no cover
    from .layer import KCLALayer


class KCLAOutput:
    """The output of one :class:`.CompiledUpdate` node, recomputed for the
    ``consumers`` nodes that read it in backward; computed once per
    backward pass and dropped when the last of them has taken it."""

    def __init__(self, node, consumers: int):
        self.node = weakref.ref(node)
        self.consumers = consumers
        self.left = 0
        self.out: Optional[Tensor] = None
        # It takes U^t once per backward pass, for all of them.
        node.tape.consumes(node.step)

    def take(self) -> Tensor:
        """The node's forward output, bit for bit."""
        if self.out is None:
            node = self.node()
            (x, _, w, scale, mask, kernel, gamma, beta, branch_scale, mean,
             var) = saved(node)
            u = node.tape.state(node.step)
            with phase('output_recompute'):
                self.out = extension().branch_output(
                    x, u, w, scale, kernel, gamma, beta, mean, var,
                    node.params.norm.eps, branch_scale,
                    None if mask is None else mask.view(-1))
            self.left = self.consumers
        out = self.out
        self.left -= 1
        if self.left == 0:
            self.out = None
        return out


class RecomputedInputConv(torch.autograd.Function):
    """``conv(x)`` for an ``x`` that ``source`` recomputes in backward:
    keeps the weight, not ``x``."""

    @staticmethod
    def forward(ctx, conv: nn.Conv2d, source: KCLAOutput, x: Tensor,
                weight: Tensor, bias: Optional[Tensor]) -> Tensor:
        ctx.geometry = (conv.stride, conv.padding, conv.dilation, conv.groups)
        ctx.source, ctx.has_bias = source, bias is not None
        ctx.save_for_backward(weight)
        return F.conv2d(x, weight, bias, *ctx.geometry)

    @staticmethod
    def backward(ctx, grad: Tensor):
        differentiable_once('RecomputedInputConv')
        weight, = saved(ctx)
        x = ctx.source.take()
        stride, padding, dilation, groups = ctx.geometry
        needs = ctx.needs_input_grad
        grad_x, grad_weight, grad_bias = torch.ops.aten.convolution_backward(
            grad, x, weight, [weight.shape[0]] if ctx.has_bias else None,
            stride, padding, dilation, False, [0, 0], groups,
            [needs[2], needs[3], ctx.has_bias and needs[4]])
        return None, None, grad_x, grad_weight, grad_bias


def recomputable_downsample(block: nn.Module) -> bool:
    """Whether the block's downsample is none or mmdet's and mmseg's
    ``Sequential(conv 1x1, norm)`` with a plain conv (not ``avg_down``'s
    pooling first, which would keep its input)."""
    down = block.downsample
    if down is None:
        return True
    return (type(down) is nn.Sequential and len(down) == 2
            and plain_conv(down[0]) and not has_hooks(down))


def producer(x: Tensor, state: Optional[KCLAState]):
    """The :class:`.CompiledUpdate` node whose output ``x`` is, found
    through the state it passed on; None where ``x`` is anything else."""
    if state is None or state.tape is None:
        return None
    tape, step = state.tape
    ref = tape.nodes.get(step)
    node = None if ref is None else ref()
    if (node is None or x.grad_fn is not node or x.output_nr != 0
            or not isinstance(node, CompiledUpdate._backward_cls)):
        return None
    return node


def recomputes_input(block: nn.Module, x: Tensor,
                     state: Optional[KCLAState]) -> bool:
    """Whether :func:`block_with_recomputed_input` applies (module
    docstring)."""
    return (torch.is_grad_enabled() and type(block) in KNOWN_BLOCKS
            and not getattr(block, 'with_plugins', False) and not block.with_cp
            and not module_hooks._global_forward_hooks
            and not module_hooks._global_forward_pre_hooks
            and plain_conv(block.conv1) and recomputable_downsample(block)
            and not in_process_group() and not is_compiling()
            and not is_exporting() and producer(x, state) is not None)


def recomputed_input_conv(conv: nn.Conv2d, source: KCLAOutput,
                          x: Tensor) -> Tensor:
    """The :class:`RecomputedInputConv` node of ``conv``."""
    return RecomputedInputConv.apply(conv, source, x, conv.weight, conv.bias)


def block_with_recomputed_input(
        block: nn.Module, layer: 'KCLALayer', x: Tensor,
        state: Optional[KCLAState]) -> Optional[Tuple[Tensor, KCLAState]]:
    """``layer(block(x), state)`` with the block's convs that read ``x``
    recomputing it in backward where :func:`recomputes_input`; None
    (nothing run) elsewhere."""
    if not recomputes_input(block, x, state):
        return None
    down = block.downsample
    source = KCLAOutput(producer(x, state), 1 if down is None else 2)
    # The block's forward (mmdet's and mmseg's alike), without plugins.
    out = block.relu(
        block.norm1(recomputed_input_conv(block.conv1, source, x)))
    if isinstance(block, BOTTLENECKS):
        out = block.relu(block.norm2(block.conv2(out)))
        out = block.norm3(block.conv3(out))
    else:
        out = block.norm2(block.conv2(out))
    identity = x if down is None else down[1](
        recomputed_input_conv(down[0], source, x))
    return block_tail_and_layer(layer, block.relu, out, identity, state)
