# Copyright (c) kcla_mm contributors. Licensed under the Apache License 2.0.
"""Cost of a layer-attention backbone: FLOPs, state memory, train memory.

FLOPs are mmengine's (``mmengine.analysis.FlopAnalyzer``, fvcore's jit
counter: one multiply-accumulate counts as one FLOP). Out of the box it
counts convolutions (the Q/K conv1d and the depthwise value convs included),
matmul, bmm and einsum, but skips, as "unsupported", the ops that carry the
layer attention itself: ``baddbmm`` (LA's weighted sum over the cache and
KCLA's state update in training), ``addcmul``/``addcmul_`` (KCLA's state
update in inference, MRLA-light's decay term) and ``softmax``/``sigmoid``/
``exp``. :data:`ATTENTION_OP_HANDLES` adds them: baddbmm as its bmm,
addcmul as one FLOP per output element, the pointwise nonlinearities as one
per input element. Other elementwise ops and reductions (mul, div, sum,
norm) stay uncounted, as fvcore leaves the ResNet's own ReLU and residual
add uncounted.
"""
import contextlib
import dataclasses
from typing import Any, Dict, Iterator, List, Tuple

import torch
import torch.nn as nn
from mmengine.analysis import FlopAnalyzer
from mmengine.analysis.jit_handles import elementwise_flop_counter, get_shape
from torch import Tensor

from ..torch_compat import has_mem_tracker


def _baddbmm_flop_jit(inputs: List[Any], outputs: List[Any]) -> int:
    """baddbmm(base, a, b): the bmm a @ b; the add rides along."""
    n, c, t = get_shape(inputs[1])
    return n * c * t * get_shape(inputs[2])[-1]


ATTENTION_OP_HANDLES = {
    'aten::baddbmm': _baddbmm_flop_jit,
    'aten::addcmul': elementwise_flop_counter(0, 1),
    'aten::addcmul_': elementwise_flop_counter(0, 1),
    'aten::softmax': elementwise_flop_counter(1, 0),
    'aten::sigmoid': elementwise_flop_counter(1, 0),
    'aten::exp': elementwise_flop_counter(1, 0),
}


@contextlib.contextmanager
def fused_kcla_while_traced(model: nn.Module) -> Iterator[None]:
    """KCLA layers run ``'fused'`` meanwhile: traced, ``'auto'`` and
    ``'recompute'`` would run the reference equations (the export path of
    :data:`kcla_mm.models.layers.kcla.dispatch.DISPATCH`), whose state
    update is an uncounted mul and add; the FLOPs counted are those of the
    eval forward's fused work (the state update as baddbmm / addcmul)."""
    from ..models.layers import KCLALayer
    layers = [(m, m.implementation) for m in model.modules()
              if isinstance(m, KCLALayer)]
    for m, _ in layers:
        m.implementation = 'fused'
    try:
        yield
    finally:
        for m, implementation in layers:
            m.implementation = implementation


def count_flops(model: nn.Module, inputs: Tensor) -> int:
    """FLOPs (MACs) of one eval forward, attention ops included."""
    model.eval()
    with torch.no_grad(), fused_kcla_while_traced(model):
        analyzer = FlopAnalyzer(model, (inputs, ))
        analyzer.set_op_handle(**ATTENTION_OP_HANDLES)
        analyzer.unsupported_ops_warnings(False)
        analyzer.uncalled_modules_warnings(False)
        return int(analyzer.total())


def attention_modules(model: nn.Module) -> Iterator[Tuple[str, nn.Module]]:
    """The layer-attention modules of a CrossLayerResNet, block order
    (``layerN.J.<attention_name>``); nothing for a plain ResNet."""
    attr = getattr(model, 'attention_name', None)
    if attr is None:
        return
    for layer_name in model.res_layers:
        for j, block in enumerate(getattr(model, layer_name)):
            yield f'{layer_name}.{j}.{attr}', getattr(block, attr)


def eval_forward_with_hooks(model: nn.Module, inputs: Tensor,
                            handles: List) -> None:
    """One eval forward without autograd, then removes ``handles`` (the
    hooks that recorded what the caller wants), also when it fails."""
    try:
        model.eval()
        with torch.no_grad():
            model(inputs)
    finally:
        for handle in handles:
            handle.remove()


def tensor_bytes(obj) -> int:
    """Bytes of the distinct storages of the tensors in ``obj`` (a tensor
    or a nest of tuples/lists/dicts/dataclasses such as ``KCLAState`` of
    them)."""
    storages: Dict[int, int] = {}

    def visit(o):
        if isinstance(o, Tensor):
            storage = o.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
        elif isinstance(o, (tuple, list)):
            for item in o:
                visit(item)
        elif dataclasses.is_dataclass(o):
            for field in dataclasses.fields(o):
                visit(getattr(o, field.name))
        elif isinstance(o, dict):
            for item in o.values():
                visit(item)

    visit(obj)
    return sum(storages.values())


def inference_state_bytes(model: nn.Module, inputs: Tensor) -> int:
    """The largest state any block hands to the next in an eval forward:
    the memory that layer attention keeps alive across blocks (KCLA's U and
    Z, LA's cache of keys and block outputs, MRLA-light's O^{t-1}). 0 for a
    plain ResNet."""
    sizes: List[int] = []
    handles = [
        module.register_forward_hook(
            lambda m, args, out: sizes.append(tensor_bytes(out[1])))
        for _, module in attention_modules(model)
    ]
    eval_forward_with_hooks(model, inputs, handles)
    return max(sizes, default=0)


def train_step_allocated_peak(model: nn.Module, inputs: Tensor) -> int:
    """The high-water mark of the bytes held by tensors during one train
    step (forward and backward in the model's current mode) on the CPU,
    above their level before the step: the CPU counterpart of
    ``torch.cuda.max_memory_allocated``, read from ``torch.profiler``'s
    allocation records (torch 2.1 has them too). It counts the
    activations, the temporaries of forward and backward and the weights'
    gradients the step allocates (set to None before it), and not what the
    C allocator keeps of freed memory, which a resident set's high-water
    mark also holds. Scratch memory that compiled code takes outside
    torch's allocator (a kernel's per-thread buffers) is not counted.

    Raises:
        ValueError: ``inputs`` are not on the CPU.
    """
    if inputs.device.type != 'cpu':
        raise ValueError('train_step_allocated_peak measures the CPU; '
                         f'inputs are on {inputs.device} (use '
                         'torch.cuda.max_memory_allocated there)')
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile
    model.zero_grad(set_to_none=True)
    # The step of saved_activation_bytes, not timing.train_step's: the
    # outputs stay alive through the backward (4 MiB of ResNet-50's
    # detection peak), so both figures describe one step.
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as p:
        outs = model(inputs)
        sum(o.float().mean() for o in outs).backward()
        del outs
    model.zero_grad(set_to_none=True)

    changes: List[Tuple[int, int]] = []  # (time in ns, bytes; < 0 freed)

    def visit(event) -> None:
        if event.typed[0] == _EventType.Allocation:
            fields = event.typed[1]
            if fields.device.type == 'cpu':
                changes.append((event.start_time_ns, fields.alloc_size))
        for child in event.children:
            visit(child)

    for root in p.profiler.kineto_results.experimental_event_tree():
        visit(root)
    # A stable sort: records of one instant keep the order they were made.
    changes.sort(key=lambda change: change[0])
    held = peak = 0
    for _, size in changes:
        held += size
        peak = max(peak, held)
    return peak


def train_step_peak_bytes(model: nn.Module, inputs: Tensor) -> int:
    """Peak memory of one train step (forward and backward) on the inputs'
    device, as torch's ``MemTracker`` accounts it: parameters, buffers,
    gradients, activations and temporaries alive at the same time.

    Raises:
        RuntimeError: torch has no ``MemTracker`` (e.g. torch 2.1); check
            :func:`kcla_mm.torch_compat.has_mem_tracker` first.
    """
    if not has_mem_tracker():
        raise RuntimeError(
            'train_step_peak_bytes needs torch.distributed._tools.'
            f'mem_tracker, which torch {torch.__version__} does not have')
    from torch.distributed._tools.mem_tracker import MemTracker
    model.train()
    model.zero_grad(set_to_none=True)
    tracker = MemTracker()
    tracker.track_external(model)
    with tracker:
        outs = model(inputs)
        sum(o.mean() for o in outs).backward()
    model.zero_grad(set_to_none=True)
    peaks = tracker.get_tracker_snapshot('peak')
    return int(peaks[inputs.device]['Total'])


def saved_activation_bytes(model: nn.Module, inputs: Tensor) -> int:
    """Bytes that autograd keeps for the backward pass of one train step
    (each storage counted once), the model's own weights excluded: the
    activation memory of training.

    Runs one forward and backward in the model's current mode; the
    gradients it leaves are the caller's to clear.
    """
    storages: Dict[int, int] = {}
    # Convs and linears keep their weights for backward: that memory is the
    # model's, whatever the batch.
    weights = {
        t.untyped_storage().data_ptr()
        for t in list(model.parameters()) + list(model.buffers())
    }

    def pack(t: Tensor) -> Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in weights:
            storages[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        outs = model(inputs)
    sum(o.float().mean() for o in outs).backward()
    return sum(storages.values())
