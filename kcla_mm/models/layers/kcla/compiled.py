# Copyright (c) kcla_mm contributors. Licensed under the Apache License 2.0.
"""KCLALayer's 'compiled' implementation: the block-sized work of a layer
(state update, depthwise conv, norm, ReLU, drop path, residual add) in the
C++ kernels of ``kcla_mm/csrc/kcla_branch.cpp``, one (sample, channel)
plane at a time, forward and backward.

Eager PyTorch runs these as six to eight passes over block-sized tensors
and keeps four of them for backward; the kernels make two passes (one in
inference) and keep none: the backward pass recomputes the state with the
:class:`~.recompute.StateTape` of ``'recompute'`` and the conv plane by
plane, in cache. In inference the pooled-vector work (queries, keys, weights,
gate) is one more kernel call, and Algorithm 1, where the layer
re-normalises, another; in training the pooled vectors are one node of
their own (:class:`CompiledPooled`) and Algorithm 1 stays in PyTorch, with
autograd.

The extension is built by ``pip install -e .`` (setup.py) where a C++
compiler is found; ``kcla_implementation='auto'`` (the default) uses it for
what it covers (CPU, fp32/fp64, NCHW, BatchNorm, no autocast) and
:mod:`.fused` for everything else. The pure-PyTorch layer is the
oracle it is tested against (tests/test_kcla_compiled.py).
"""
import glob
import importlib
import os
import os.path as osp
import warnings
from functools import lru_cache
from types import ModuleType
from typing import Callable, Optional, Tuple

import torch
import torch.nn as nn
from torch import Tensor
from torch.nn.modules.batchnorm import _BatchNorm

from ....torch_compat import is_autocast_enabled, is_compiling, is_exporting
from ..attention_branch import drop_path_mask, spatial_mean
from ..profiling import phase
from .fused import folds_renormalise, renormalise_in_forward
from .gradient_reuse import reusable_gradients, unshared_holders
from .params import KCLAParams
from .recompute import (StateTape, differentiable_once, differentiates,
                        recomputed_forward, saved, torch_pooled)
from .state import STATE_EPS, KCLAState


def extension_name() -> str:
    """The kernels' module for the running torch: setup names the build
    after the torch it compiled against (``kcla_mm._kcla_cpu_t2_13``), so
    that a build for another torch is never loaded."""
    major, minor = torch.__version__.split('.')[:2]
    return f'kcla_mm._kcla_cpu_t{major}_{minor}'


#: The environment variable that turns the kernels off: set to anything but
#: '' or '0', :func:`extension` returns None as on an install without them
#: (``'auto'`` then runs ``'fused'``, ``'compiled'`` refuses to build).
NO_EXTENSION_ENV = 'KCLA_MM_NO_EXTENSION'


def extension_disabled() -> bool:
    """Whether :data:`NO_EXTENSION_ENV` turns the kernels off."""
    return os.environ.get(NO_EXTENSION_ENV, '0') not in ('', '0')


def extension() -> Optional[ModuleType]:
    """The compiled kernels, or None where setup did not build them for
    this torch (no compiler, torch upgraded since, or a source tree used
    without installing) or where ``KCLA_MM_NO_EXTENSION`` is set (to
    anything but '' or '0'); a warning says so if a build for another
    torch is there."""
    if extension_disabled():
        return None
    return load_extension()


#: The kernels' interface that this module calls (``interface`` of the
#: built module, raised with every change to the functions' arguments or
#: results): a build of older sources, left in a source tree that was
#: updated without reinstalling, is not loaded.
KERNEL_INTERFACE = 5


@lru_cache(maxsize=None)
def load_extension() -> Optional[ModuleType]:
    """:func:`extension` without the environment check, imported once."""
    try:
        module = importlib.import_module(extension_name())
        built = getattr(module, 'interface', 1)
        if built != KERNEL_INTERFACE:
            warnings.warn(
                f'kcla_mm: the compiled KCLA kernels ({module.__file__}) were '
                f'built from other sources (interface {built}, these sources '
                f'call {KERNEL_INTERFACE}): reinstall kcla_mm '
                '(`pip install --no-build-isolation -e .`) to rebuild them; '
                'the pure-PyTorch layer runs meanwhile',
                stacklevel=3)
            return None
        return module
    except ImportError:
        others = glob.glob(
            osp.join(
                osp.dirname(osp.dirname(osp.dirname(osp.dirname(__file__)))),
                '_kcla_cpu_t*'))
        if others:
            warnings.warn(
                f'kcla_mm: the compiled KCLA kernels were built for another '
                f'torch ({", ".join(sorted(map(osp.basename, others)))}), '
                f'not for torch {torch.__version__}: reinstall kcla_mm '
                '(`pip install --no-build-isolation -e .`) to build them; '
                'the pure-PyTorch layer runs meanwhile',
                stacklevel=3)
        return None


def require_extension() -> ModuleType:
    """The compiled kernels, or an error that says how to build them."""
    ext = extension()
    if ext is None:
        if extension_disabled():
            raise RuntimeError(
                f"implementation='compiled' needs the C++ extension "
                f'{extension_name()}, which {NO_EXTENSION_ENV}='
                f'{os.environ[NO_EXTENSION_ENV]!r} turns off: unset it, or '
                "use implementation='auto' or 'fused'")
        raise RuntimeError(
            f"implementation='compiled' needs the C++ extension "
            f'{extension_name()}, which is not built: reinstall kcla_mm from '
            'source with a C++ compiler (`pip install --no-build-isolation '
            "-e .`), or use implementation='auto' or 'fused'")
    return ext


def _state_matches(x: Tensor, state: Optional[KCLAState]) -> bool:
    return state is None or (state.u.dtype == x.dtype
                             and state.u.is_contiguous())


#: What the kernels need of a call, in the order they are checked:
#: (condition, test(params, x, state)). :func:`compiled_unmet` names the
#: first that does not hold. Never under torch.compile (dynamo cannot
#: trace into the extension and would break the graph at every call; the
#: fused path compiles whole) nor while exporting or tracing
#: (``torch.jit.trace`` for FLOP counts, ``torch.onnx.export``,
#: ``torch.export``: :func:`.is_exporting`): the recorder cannot see into
#: the kernels and would record their outputs as constants, or fail at the
#: extension lookup. A training BN over one value
#: per channel is left to PyTorch's, which refuses it.
COMPILED_CONDITIONS: Tuple[Tuple[str, Callable[..., bool]], ...] = (
    ('not under torch.compile', lambda p, x, state: not is_compiling()),
    ('not exporting or tracing (torch.jit.trace, torch.onnx.export, '
     'torch.export)', lambda p, x, state: not is_exporting()),
    ('the C++ extension is available',
     lambda p, x, state: extension() is not None),
    ('the input is on the CPU', lambda p, x, state: x.device.type == 'cpu'),
    ('the input is fp32 or fp64', lambda p, x, state: x.dtype in
     (torch.float32, torch.float64)),
    ('the input is contiguous (NCHW)', lambda p, x, state: x.is_contiguous()),
    ('CPU autocast is off',
     lambda p, x, state: not is_autocast_enabled('cpu')),
    ("the layer's weights are in the input's dtype",
     lambda p, x, state: p.value_weight.dtype == x.dtype),
    ('the norm is a BatchNorm (not SyncBN)', lambda p, x, state: isinstance(
        p.norm, _BatchNorm) and not isinstance(p.norm, nn.SyncBatchNorm)),
    ("the state is in the input's dtype and contiguous",
     lambda p, x, state: _state_matches(x, state)),
    ('a training BN sees more than one value per channel', lambda p, x, state:
     not (uses_batch_stats(p.norm) and x.numel() == x.shape[1])),
)


def compiled_unmet(p: KCLAParams, x: Tensor,
                   state: Optional[KCLAState]) -> Optional[str]:
    """The first of :data:`COMPILED_CONDITIONS` that this call does not
    meet, or None where the kernels cover it."""
    for condition, holds in COMPILED_CONDITIONS:
        if not holds(p, x, state):
            return condition
    return None


def compiled_applies(p: KCLAParams, x: Tensor,
                     state: Optional[KCLAState]) -> bool:
    """Whether the kernels cover this call: CPU, fp32 or fp64 throughout,
    NCHW, a BatchNorm (not SyncBN, GN, ...) and no autocast, nor tracing
    (:data:`COMPILED_CONDITIONS`)."""
    return compiled_unmet(p, x, state) is None


def uses_batch_stats(norm: _BatchNorm) -> bool:
    """Whether the BN normalises with the batch's statistics."""
    return norm.training or norm.running_mean is None


def update_running_stats(norm: _BatchNorm, mean: Tensor, var: Tensor,
                         count: int) -> None:
    """What a training ``_BatchNorm.forward`` does to its buffers, from the
    batch's mean and biased variance over ``count`` values a channel."""
    if not (norm.training and norm.track_running_stats):
        return
    # Through .data, which leaves the buffers' version counters alone, as
    # PyTorch's batch_norm does: a graph of an earlier call of the layer
    # that ran PyTorch's BN ('fused' in the same train step) saved the
    # buffers, and its backward would otherwise refuse to run.
    with torch.no_grad():
        norm.num_batches_tracked.add_(1)
        factor = (1.0 / float(norm.num_batches_tracked)
                  if norm.momentum is None else norm.momentum)
        norm.running_mean.data.mul_(1 - factor).add_(mean, alpha=factor)
        norm.running_var.data.mul_(1 - factor).add_(
            var, alpha=factor * count / max(count - 1, 1))


def norm_args(norm: _BatchNorm, batch_stats: bool):
    """(weight, bias, running_mean, running_var) as the kernels take
    them."""
    return (norm.weight, norm.bias, None if batch_stats else norm.running_mean,
            None if batch_stats else norm.running_var)


def compiled_advance(u: Optional[Tensor], w: Tensor, x: Tensor,
                     out: Optional[Tensor]) -> Tensor:
    """The state update of :class:`CompiledUpdate`'s forward kernel alone,
    bit for bit, for the :class:`StateTape`; into ``out`` where given (the
    tape's previous state, which nothing else holds), so that a
    recomputation makes one pass and allocates nothing."""
    return extension().state_forward(x, u, w, out)


class CompiledUpdate(torch.autograd.Function):
    """(x, U^{t-1}, w, scale, mask, kernel, gamma, beta, branch_scale) ->
    (x + branch, U^t) in the kernels. Keeps for backward x (the block's ReLU
    keeps it too), per-channel statistics, vectors and, only where no tape
    can recompute it, U^{t-1}; its saved tensors start with (x, U^{t-1},
    w), as the :class:`StateTape` reads them."""

    @staticmethod
    def forward(ctx, p: KCLAParams, tape: StateTape, step: int,
                keep_prev: bool, x: Tensor, u_prev: Optional[Tensor],
                w: Tensor, scale: Tensor, mask: Optional[Tensor],
                kernel: Tensor, gamma: Optional[Tensor],
                beta: Optional[Tensor],
                branch_scale: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
        norm = p.norm
        batch_stats = uses_batch_stats(norm)
        with phase('update_branch'):
            out, u, mean, var = extension().branch_forward(
                x, u_prev, w, scale, kernel, gamma, beta,
                *norm_args(norm, batch_stats)[2:], batch_stats, norm.eps,
                branch_scale, None if mask is None else mask.view(-1), False,
                False)
        if batch_stats:
            update_running_stats(norm, mean, var, x.numel() // x.shape[1])
        ctx.params, ctx.tape, ctx.step = p, tape, step
        ctx.keep_prev, ctx.batch_stats = keep_prev, batch_stats
        tape.record(step, ctx, keep_prev, compiled_advance)
        ctx.save_for_backward(x, u_prev if keep_prev else None, w, scale, mask,
                              kernel, gamma, beta, branch_scale, mean, var)
        return out, u

    @staticmethod
    def backward(ctx, grad_out: Tensor, grad_u: Tensor):
        # First, before this frame takes more references to them.
        reuse_out, reuse_u = reusable_gradients(grad_out, grad_u)
        differentiable_once('CompiledUpdate')
        (x, u_prev, w, scale, mask, kernel, gamma, beta, branch_scale, mean,
         var) = saved(ctx)
        if ctx.keep_prev:
            ctx.tape.cache.pop(0, None)
        else:
            u_prev = ctx.tape.state(ctx.step - 1)
        with phase('update_branch_backward'):
            grads = extension().branch_backward(
                grad_out.contiguous(), grad_u.contiguous(), x, u_prev, w,
                scale, kernel, gamma, beta, mean, var, ctx.batch_stats,
                ctx.params.norm.eps, branch_scale,
                None if mask is None else mask.view(-1),
                grad_out if reuse_out else None, grad_u if reuse_u else None)
        grad_x, grad_u_prev, grad_w, grad_scale, grad_kernel = grads[:5]
        grad_gamma, grad_beta, grad_branch_scale = grads[5:]
        needs = ctx.needs_input_grad
        return (None, None, None, None, grad_x if needs[4] else None,
                grad_u_prev if needs[5] else None,
                grad_w if needs[6] else None, grad_scale if needs[7] else None,
                None, grad_kernel.view_as(kernel) if needs[9] else None,
                grad_gamma if needs[10] else None,
                grad_beta if needs[11] else None,
                grad_branch_scale if needs[12] else None)


def compiled_update(p: KCLAParams, tape: StateTape, step: int, keep_prev: bool,
                    x: Tensor, u_prev: Optional[Tensor], w: Tensor,
                    scale: Tensor,
                    mask: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
    """The update node of :func:`.recomputed_forward`, in the kernels."""
    unshared_holders()  # calibrated here, outside any backward pass
    return CompiledUpdate.apply(p, tape, step, keep_prev, x, u_prev, w, scale,
                                mask, p.value_weight, p.norm.weight,
                                p.norm.bias, p.branch_scale)


class CompiledPooled(torch.autograd.Function):
    """(means, query_weight, key_weight, head_mix, Z^{t-1}) -> (w, Z^t,
    gate / (Z^t + eps)) of a train step in the kernels: ``pooled_forward``
    and ``pooled_backward``, where eager PyTorch runs about fifteen ops on
    (N, C) and (N, heads) vectors each way, each costing more to dispatch
    and record than to compute. Keeps the plane means in float64 and
    recomputes the vectors in backward."""

    @staticmethod
    def forward(ctx, p: KCLAParams, shape: torch.Size, means: Tensor,
                query_weight: Tensor, key_weight: Tensor, head_mix: Tensor,
                z_prev: Optional[Tensor]) -> Tuple[Tensor, Tensor, Tensor]:
        means64 = means.to(torch.float64).contiguous()
        # The kernels read only x's sizes and dtype where given the means.
        ctx.x = means.new_empty((*shape[:2], 1, 1), dtype=query_weight.dtype)
        ctx.params, ctx.means_dtype = p, means.dtype
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(means64, query_weight, key_weight, head_mix,
                              z_prev)
        return tuple(extension().pooled_forward(ctx.x, query_weight,
                                                key_weight, p.tau, p.clamp,
                                                head_mix, z_prev, STATE_EPS,
                                                means64))

    @staticmethod
    def backward(ctx, grad_w: Optional[Tensor], grad_z: Optional[Tensor],
                 grad_scale: Optional[Tensor]):
        differentiable_once('CompiledPooled')
        means64, query_weight, key_weight, head_mix, z_prev = saved(ctx)
        p = ctx.params
        (grad_means, grad_query, grad_key, grad_mix,
         grad_z_prev) = extension().pooled_backward(grad_w, grad_z, grad_scale,
                                                    ctx.x, query_weight,
                                                    key_weight, p.tau, p.clamp,
                                                    head_mix, z_prev,
                                                    STATE_EPS, means64)
        needs = ctx.needs_input_grad
        return (None, None,
                grad_means.to(ctx.means_dtype) if needs[2] else None,
                grad_query.view_as(query_weight) if needs[3] else None,
                grad_key.view_as(key_weight) if needs[4] else None,
                grad_mix.view_as(head_mix) if needs[5] else None,
                grad_z_prev if needs[6] else None)


def pooled_compiles(p: KCLAParams, x: Tensor,
                    z_prev: Optional[Tensor]) -> bool:
    """Whether :class:`CompiledPooled` covers a train step's pooled vectors
    (beyond :func:`compiled_applies`, which the caller checked): the
    weights, temperatures and Z^{t-1} in ``x``'s dtype and contiguous, and
    the ECA-style convs that :func:`.eca_conv1d` builds."""
    tensors = (p.query_weight, p.key_weight, p.head_mix, p.tau) + (
        () if z_prev is None else (z_prev, ))
    ks = p.query_weight.numel()
    return (all(t.dtype == x.dtype and t.is_contiguous() for t in tensors)
            and p.key_weight.numel() == ks and ks % 2 == 1
            and p.eca_padding == (ks - 1) // 2)


def compiled_pooled(p: KCLAParams, x: Tensor, means: Optional[Tensor],
                    z_prev: Optional[Tensor]) -> Tuple[Tensor, Tensor, Tensor]:
    """The pooled vectors of :func:`.recomputed_forward` for the kernels'
    update node: :class:`CompiledPooled` where :func:`pooled_compiles`,
    else the PyTorch ops (:func:`.torch_pooled`)."""
    if not pooled_compiles(p, x, z_prev):
        return torch_pooled(p, x, means, z_prev)
    if means is None:
        means = spatial_mean(x)
    return CompiledPooled.apply(p, x.shape, means, p.query_weight,
                                p.key_weight, p.head_mix, z_prev)


def renormalise_compiles(p: KCLAParams, state: KCLAState) -> bool:
    """Whether :func:`compiled_renormalise` covers Algorithm 1 here: where
    :func:`.folds_renormalise` does (inference, an eval BN, a plain 1x1
    adapter or none, an NCHW state in the weights' dtype), with one stride
    for both axes, the norm's statistics in the state's dtype and the
    ECA-style key conv that :func:`.eca_conv1d` builds."""
    conv, key_conv = p.state_adapt, p.state_key_conv
    return (folds_renormalise(p, state)
            and (conv is None or conv.stride[0] == conv.stride[1])
            and p.state_norm.running_mean.dtype == state.u.dtype
            and key_conv.bias is None and key_conv.stride == (1, )
            and key_conv.dilation == (1, )
            and key_conv.padding == ((key_conv.kernel_size[0] - 1) // 2, ))


def compiled_renormalise(p: KCLAParams, state: KCLAState) -> KCLAState:
    """:func:`.folded_renormalise` in one kernel call (see
    :func:`renormalise_compiles`): the same folded weights and one batched
    matmul, without the twenty small ops around it, each of which costs
    more than its work at batch 1."""
    conv, norm = p.state_adapt, p.state_norm
    u, z = extension().renormalise_forward(
        state.u, state.z, None if conv is None else conv.weight,
        1 if conv is None else conv.stride[0], norm.weight, norm.bias,
        norm.running_mean, norm.running_var, norm.eps, p.state_key_conv.weight,
        p.tau, p.clamp)
    return KCLAState(u, z)


def compiled_forward(p: KCLAParams,
                     x: Tensor,
                     state: Optional[KCLAState],
                     means: Optional[Tensor] = None,
                     overwrite_x: bool = False) -> Tuple[Tensor, KCLAState]:
    """:meth:`KCLALayer.forward_reference` in the kernels (see
    :func:`compiled_applies`); a train step goes through
    :func:`.recomputed_forward`'s tape, other calls straight to the
    kernels.

    Without autograd, ``means`` may give ``x``'s plane means (N, C) in
    float64, and ``overwrite_x`` let the output be written over ``x``: both
    for a caller that made ``x`` itself (:mod:`.block_tail`). The incoming
    state is never written over (its caller may hold it); Algorithm 1's new
    one, which this call makes, is (:func:`owns_new_state`)."""
    if differentiates(p, x, state):
        return recomputed_forward(
            p, x, state, update=compiled_update, pooled=compiled_pooled)
    ext = extension()
    # Whether U^t may be written over U^{t-1}: only over a state that this
    # call made itself (Algorithm 1's), which nothing else holds.
    state_inplace = False
    if state is not None and p.renorm:
        incoming = state.u
        with phase('renormalise'):
            if renormalise_compiles(p, state):
                state = compiled_renormalise(p, state)
            else:
                state = renormalise_in_forward(p, state)
        state_inplace = owns_new_state(state.u, incoming, x)
    with phase('pooled'):
        w, z, scale = ext.pooled_forward(x, p.query_weight, p.key_weight,
                                         p.tau, p.clamp, p.head_mix,
                                         None if state is None else state.z,
                                         STATE_EPS, means)
    norm = p.norm
    batch_stats = uses_batch_stats(norm)
    mask = drop_path_mask(x, p.drop_path, p.training)
    no_grad = not torch.is_grad_enabled()
    out_in_place = overwrite_x and no_grad
    with phase('update_branch'):
        out, u, mean, var = ext.branch_forward(
            x, None if state is None else state.u, w, scale, p.value_weight,
            *norm_args(norm, batch_stats), batch_stats, norm.eps,
            p.branch_scale, None if mask is None else mask.view(-1),
            out_in_place, state_inplace)
    if batch_stats:
        update_running_stats(norm, mean, var, x.numel() // x.shape[1])
    return out, KCLAState(u, z)


def owns_new_state(u: Tensor, incoming: Tensor, x: Tensor) -> bool:
    """Whether Algorithm 1's new state ``u``, made without autograd by the
    call itself from the ``incoming`` one, is a whole tensor of its own
    that the kernels can write ``U^t`` over: not the incoming state nor a
    view, contiguous and of ``x``'s shape and dtype."""
    return (u is not incoming and not u.requires_grad and not u._is_view()
            and u.storage_offset() == 0 and u.is_contiguous()
            and u.shape == x.shape and u.dtype == x.dtype)
