# Copyright (c) kcla_mm contributors. Licensed under the Apache License 2.0.
"""What the fast implementations of :class:`~.KCLALayer` read: one typed
bundle, :class:`KCLAParams`, made by :meth:`KCLALayer.params` for each
call, instead of the module's attributes.

An implementation sees exactly these tensors, modules and settings, and an
autograd node that recomputes in backward keeps the bundle of its forward
pass, so the replay reads the tensors that the forward pass read.
"""
import contextlib
from typing import Iterator, List, NamedTuple, Optional, Sequence, Tuple

import torch
import torch.nn as nn
from torch import Tensor

#: (module, attribute name, tensor): a tensor a module computes with.
TensorAttribute = Tuple[nn.Module, str, Tensor]


def tensor_attributes(module: nn.Module) -> List[TensorAttribute]:
    """What ``module`` computes with: its ``weight`` and ``bias``
    attributes (parameters or, under a flattening wrapper, views), then any
    other parameter it or its children register (a conv from ``conv_cfg``
    may hold more)."""
    found = []
    for name in ('weight', 'bias'):
        t = getattr(module, name, None)
        if isinstance(t, Tensor):
            found.append((module, name, t))
    for qualified, t in module.named_parameters():
        if any(t is seen for _, _, seen in found):
            continue
        path, _, name = qualified.rpartition('.')
        found.append((module.get_submodule(path) if path else module, name, t))
    return found


@contextlib.contextmanager
def bound_tensors(attributes: Sequence[TensorAttribute],
                  tensors: Sequence[Tensor]):
    """Sets each ``(module, name, _)`` of ``attributes`` to the matching
    tensor of ``tensors`` for the duration, then restores what was there.

    A backward pass that replays a forward computation must compute with
    the tensors the forward pass used (saved with its node), not with what
    the modules hold by then: a wrapper may have replaced their parameters
    with new views (FSDP1) or shards (FSDP2) in between, and gradients of
    the replay must reach the saved ones."""
    restore = []
    try:
        for (module, name, _), t in zip(attributes, tensors):
            store = (
                module._parameters
                if name in module._parameters else module.__dict__)
            restore.append((store, name, store.get(name, _ABSENT)))
            store[name] = t
        yield
    finally:
        for store, name, old in reversed(restore):
            if old is _ABSENT:
                del store[name]
            else:
                store[name] = old


_ABSENT = object()


class KCLAParams(NamedTuple):
    """The tensors and settings of one :class:`~.KCLALayer` call.

    Attributes:
        num_heads (int): Heads of the layer.
        head_dim (int): Channels per head.
        query_weight (Tensor): Kernel of the ECA conv1d for Q, (1, 1, k).
        key_weight (Tensor): Kernel of the ECA conv1d for K, (1, 1, k).
        eca_padding (int): Padding of the ECA conv1ds (``k // 2``).
        head_mix (Tensor): Phi, the (heads, heads) map over heads.
        tau (Tensor): Per-head temperatures, (heads,).
        clamp (float): Upper bound of ||K|| / tau before ``exp``.
        value_weight (Tensor): The depthwise 3x3 kernel, (C, 1, 3, 3).
        norm (nn.Module): The branch's norm, applied as a module (its
            running statistics, its hooks).
        branch_scale (Tensor, optional): Per-channel scale of the branch
            (``zero_init_branch``), else None.
        drop_path (float): Drop-path rate of the branch.
        training (bool): The layer's mode.
        renorm (bool): Whether the layer runs Algorithm 1 on its incoming
            state.
        state_adapt (nn.Module, optional): Algorithm 1's adapter (a
            head-grouped strided 1x1 conv) where width or size changes.
        state_norm (nn.Module, optional): Algorithm 1's norm.
        state_key_conv (nn.Module, optional): Algorithm 1's ECA conv1d.
        requires_grad (bool): Whether autograd is on and some parameter of
            the layer requires a gradient.
    """
    num_heads: int
    head_dim: int
    query_weight: Tensor
    key_weight: Tensor
    eca_padding: int
    head_mix: Tensor
    tau: Tensor
    clamp: float
    value_weight: Tensor
    norm: nn.Module
    branch_scale: Optional[Tensor]
    drop_path: float
    training: bool
    renorm: bool
    state_adapt: Optional[nn.Module]
    state_norm: Optional[nn.Module]
    state_key_conv: Optional[nn.Module]
    requires_grad: bool

    def split_heads(self, t: Tensor) -> Tensor:
        """(N, C, ...) -> (N, heads, head_dim, ...), a view."""
        return t.view(t.shape[0], self.num_heads, self.head_dim, *t.shape[2:])

    def layer_weight(self, key_norm: Tensor) -> Tensor:
        """w_h = exp(min(||K_h|| / tau_h, clamp)) from ``key_norm`` =
        ||K_h||, of shape (N, heads)."""
        return torch.exp(torch.clamp(key_norm / self.tau, max=self.clamp))

    def renorm_attributes(self) -> List[TensorAttribute]:
        """Where Algorithm 1's parameters live: (module, name, tensor) of
        its adapter, norm and ECA conv1d, by attribute. A wrapper that
        flattens parameters (FSDP with ``use_orig_params=False``) leaves
        ``module.parameters()`` empty but sets the attributes to views of
        its flat parameter, which are what the modules compute with."""
        return [
            found for module in (self.state_adapt, self.state_norm,
                                 self.state_key_conv) if module is not None
            for found in tensor_attributes(module)
        ]

    def renorm_parameters(self) -> Iterator[Tensor]:
        """The tensors of :meth:`renorm_attributes`."""
        return (t for _, _, t in self.renorm_attributes())

    def norm_attributes(self) -> List[TensorAttribute]:
        """(module, name, tensor) of the branch norm's parameters."""
        return tensor_attributes(self.norm)

    def branch_parameters(self) -> Iterator[Tensor]:
        """The parameters that the state update and the branch read: the
        depthwise kernel, the norm's (:meth:`norm_attributes`), then the
        branch scale if any."""
        yield self.value_weight
        for _, _, t in self.norm_attributes():
            yield t
        if self.branch_scale is not None:
            yield self.branch_scale
