# Copyright (c) kcla_mm contributors. Licensed under the Apache License 2.0.
"""Export of kcla_mm models to ONNX (and TorchScript / torch.export), and
the parity check of an exported file in onnxruntime.

What is exported, by the kind of model a config builds
(:func:`build_exportable`):

* ``'backbone'`` (any config, ``backbone_only=True``): the backbone's
  ``out_indices`` feature maps, outputs ``feat0``, ``feat1``, ...
  (named by stage index);
* ``'classifier'`` (mmpretrain ``ImageClassifier``): ``logits``, the
  ``mode='tensor'`` output (before softmax);
* ``'segmentor'`` (mmseg): ``seg_logits``, the ``mode='tensor'`` output (at
  the decode head's resolution);
* ``'detector'`` (mmdet): backbone + neck features ``neck0``, ...; the heads
  of two-stage detectors need mmdeploy's RoI ops (README, "Export").

The graph's input is ``input``, the NCHW float tensor that the model's data
preprocessor gives (normalised, padded): the preprocessor is not exported.
While exporting, KCLA layers run the reference equations
(:mod:`kcla_mm.models.layers.kcla.dispatch`); layers built with
``implementation='compiled'`` are switched to ``'auto'`` for the export.

Errors that a user can fix (a model kind that cannot export, an op without
an ONNX symbolic, a checkpoint that does not match, an output that cannot
be written, a parity failure) raise :class:`ExportError` naming the thing;
the file is written to a temporary name in the output's folder and renamed
only once complete (with the permissions a plain ``open()`` gives), so no
partial file is left behind.
"""
import contextlib
import copy
import os
import os.path as osp
import tempfile
from typing import (Any, Callable, Dict, Iterator, List, NamedTuple, Optional,
                    Sequence, Tuple)

import torch
import torch.nn as nn
from torch import Tensor

from ..torch_compat import load_checkpoint_file
from ..utils.checkpoint_loading import without_module_prefix
from ..utils.cli import default_file_mode
from ..utils.config import is_pretrained_init

#: The ONNX opset used unless asked otherwise.
DEFAULT_OPSET = 17

#: Largest allowed max |onnx - torch| relative to max |torch| per output.
DEFAULT_TOLERANCE = 1e-4

KINDS = ('backbone', 'classifier', 'segmentor', 'detector')


class ExportError(RuntimeError):
    """A model, checkpoint or output that cannot be exported as asked; the
    message names the thing and what to do."""


class Exportable(NamedTuple):
    """A module ready to export and what its graph is called."""
    module: nn.Module
    kind: str
    output_names: Tuple[str, ...]
    description: str


class TupleOutputs(nn.Module):
    """``fn(model, x)`` as a tuple of tensors, for the exporters."""

    def __init__(self, model: nn.Module, kind: str):
        super().__init__()
        self.model = model
        self.kind = kind

    def forward(self, x: Tensor) -> Tuple[Tensor, ...]:
        if self.kind == 'backbone':
            out = self.model(x)
        elif self.kind == 'detector':
            out = self.model.extract_feat(x)
        else:  # classifier, segmentor
            out = self.model(x, mode='tensor')
        if isinstance(out, Tensor):
            return (out, )
        return tuple(out)


def strip_pretrained(cfg: Any) -> Any:
    """``cfg`` without ``init_cfg=dict(type='Pretrained')`` entries and
    ``pretrained=`` keys, which would load weights that the export replaces
    (and fail where the file is absent)."""
    if isinstance(cfg, dict):
        out = {}
        for key, value in cfg.items():
            if key == 'pretrained':
                continue
            if key == 'init_cfg' and is_pretrained_init(value):
                continue
            out[key] = strip_pretrained(value)
        return out
    if isinstance(cfg, (list, tuple)):
        return [strip_pretrained(v) for v in cfg]
    return cfg


def scope_registry(scope: str):
    """The MODELS registry of ``default_scope`` (mmdet, mmseg,
    mmpretrain)."""
    if scope == 'mmpretrain':
        from ..registry import mmpretrain_models
        registry = mmpretrain_models()
        if registry is None:
            raise ExportError(
                'this config is an mmpretrain config (default_scope='
                "'mmpretrain'), and mmpretrain is not installed (the "
                "'pretrain' extra): install it, or export its backbone "
                "alone (--backbone; a config built on mmpretrain's own "
                'files needs mmpretrain to be read at all)')
        return registry
    if scope == 'mmseg':
        from mmseg.registry import MODELS
        return MODELS
    from mmdet.registry import MODELS
    return MODELS


def model_kind(model: nn.Module) -> Optional[str]:
    """'classifier', 'segmentor' or 'detector' for the model types that
    export, else None."""
    from mmdet.models.detectors import BaseDetector
    from mmseg.models.segmentors import BaseSegmentor
    if isinstance(model, BaseDetector):
        return 'detector'
    if isinstance(model, BaseSegmentor):
        return 'segmentor'
    try:
        from mmpretrain.models.classifiers import ImageClassifier
    except Exception:  # noqa: B902  mmpretrain absent or unimportable
        return None
    return 'classifier' if isinstance(model, ImageClassifier) else None


def build_exportable(config: str,
                     checkpoint: Optional[str] = None,
                     backbone_only: bool = False) -> Exportable:
    """The model of ``config`` (with ``checkpoint``'s weights, or as
    initialised), in eval mode, wrapped for export.

    Raises:
        ExportError: a config without a model, a model kind that does not
            export, or a checkpoint that does not match the model.
    """
    from mmengine.config import Config, ConfigDict
    from mmengine.registry import init_default_scope

    import kcla_mm  # noqa: F401  registers the backbones, allow-lists

    if not osp.isfile(config):
        raise ExportError(f'config {config} does not exist')
    try:
        cfg = Config.fromfile(config)
    except ModuleNotFoundError as exc:
        raise ExportError(f'config {config} needs a package that is not '
                          f'installed: {exc}') from exc
    except Exception as exc:  # noqa: B902  a config's many ways to fail
        raise ExportError(
            f'config {config} cannot be read: {first_line(exc)}') from exc
    if 'model' not in cfg:
        raise ExportError(f'config {config} has no `model` to export')
    scope = cfg.get('default_scope', 'mmdet')
    if backbone_only and scope == 'mmpretrain':
        from ..registry import mmpretrain_models
        if mmpretrain_models() is None:  # the backbones are in mmdet's too
            scope = 'mmdet'
    init_default_scope(scope)
    model_cfg = ConfigDict(
        strip_pretrained(copy.deepcopy(cfg.model.to_dict())))
    if backbone_only:
        if 'backbone' not in model_cfg:
            raise ExportError(f'config {config}: model type '
                              f'{model_cfg.get("type")!r} has no backbone')
        model_cfg = model_cfg['backbone']
    registry = scope_registry(scope)
    try:
        model = registry.build(model_cfg)
    except Exception as exc:  # noqa: B902  unknown types, bad arguments
        raise ExportError(f'config {config}: cannot build model type '
                          f'{model_cfg.get("type")!r} in scope {scope!r} '
                          f'({first_line(exc)})') from exc
    kind = 'backbone' if backbone_only else model_kind(model)
    if kind is None:
        raise ExportError(
            f'config {config}: model type {model_cfg.get("type")!r} '
            f'({type(model).__name__}) is not a kind kcla_mm exports '
            '(mmpretrain ImageClassifier, mmseg segmentor, mmdet detector; '
            'or any backbone with --backbone)')
    if checkpoint is None:
        if hasattr(model, 'init_weights'):
            with quiet_logger():
                model.init_weights()
    else:
        load_weights(model, checkpoint, config, backbone_only)
    model.eval()
    names = output_names(model, kind)
    description = (f'{kind} {type(model).__name__} of {osp.basename(config)}' +
                   (f' with {checkpoint}' if checkpoint else
                    ' (no checkpoint: initialised weights)'))
    return Exportable(
        TupleOutputs(model, kind).eval(), kind, names, description)


@contextlib.contextmanager
def quiet_logger() -> Iterator[None]:
    """mmengine's INFO lines (one per initialised parameter) held back."""
    from mmengine.logging import MMLogger
    logger = MMLogger.get_current_instance()
    level = logger.level
    logger.setLevel('WARNING')
    try:
        yield
    finally:
        logger.setLevel(level)


def output_names(model: nn.Module, kind: str) -> Tuple[str, ...]:
    """The graph's output names (module docstring)."""
    if kind == 'classifier':
        return ('logits', )
    if kind == 'segmentor':
        return ('seg_logits', )
    if kind == 'detector':
        neck = getattr(model, 'neck', None)
        count = getattr(neck, 'num_outs', None)
        if count is None:  # no neck: the backbone's outputs
            return tuple(f'feat{i}' for i in model.backbone.out_indices)
        return tuple(f'neck{i}' for i in range(count))
    indices = getattr(model, 'out_indices', None)
    if indices is None:
        return ('feat0', )
    if isinstance(indices, int):
        indices = (indices, )
    return tuple(f'feat{i}' for i in indices)


def load_weights(model: nn.Module, checkpoint: str, config: str,
                 backbone_only: bool) -> None:
    """Loads ``checkpoint`` into ``model`` strictly; a backbone also takes
    the ``backbone.*`` keys of a whole-model checkpoint.

    Raises:
        ExportError: the file cannot be read or its keys or shapes do not
            match the model; the message names both.
    """
    if not osp.isfile(checkpoint):
        raise ExportError(f'checkpoint {checkpoint} does not exist')
    try:
        ckpt = load_checkpoint_file(checkpoint)
    except Exception as exc:  # noqa: B902  any unreadable file
        raise ExportError(
            f'checkpoint {checkpoint} cannot be read: {exc}') from exc
    state = ckpt.get('state_dict', ckpt) if isinstance(ckpt, dict) else None
    if not isinstance(state, dict):
        raise ExportError(f'checkpoint {checkpoint} holds no state dict')
    state = without_module_prefix(state)
    if backbone_only and any(str(k).startswith('backbone.') for k in state):
        state = {
            k[len('backbone.'):]: v
            for k, v in state.items() if str(k).startswith('backbone.')
        }
    unnamed = [k for k in state if not isinstance(k, str)]
    if unnamed:
        raise ExportError(f'checkpoint {checkpoint}: state_dict keys that are '
                          f'not parameter names: {unnamed[:5]}')
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise ExportError(
            f'checkpoint {checkpoint} does not match the model of config '
            f'{config}: '
            f'{state_mismatch(model.state_dict(), state) or exc}') from exc


def state_mismatch(expected: Dict[str, Any],
                   found: Dict[str, Any],
                   shown: int = 3) -> str:
    """What keeps ``found`` from loading where ``expected`` is the
    model's state dict: the keys missing from it, those it has in excess
    and those of another shape, each as a count and its first ``shown``
    keys (torch's own message lists every key, hundreds for a detector
    whose checkpoint lacks a prefix); '' where the keys and shapes agree."""

    def listed(what: str, keys: List[str]) -> Optional[str]:
        if not keys:
            return None
        more = f', ... ({len(keys)} in all)' if len(keys) > shown else ''
        return f'{what}: {", ".join(keys[:shown])}{more}'

    def shape(t: Any) -> Optional[tuple]:
        return tuple(t.shape) if isinstance(t, Tensor) else None

    parts = [
        listed('missing', [k for k in expected if k not in found]),
        listed('unexpected', [k for k in found if k not in expected]),
        listed('of another shape', [
            f'{k} {shape(found[k])} in the checkpoint, {shape(v)} in the '
            'model' for k, v in expected.items()
            if k in found and shape(found[k]) != shape(v)
        ]),
    ]
    return '; '.join(p for p in parts if p)


@contextlib.contextmanager
def export_mode(module: nn.Module) -> Iterator[None]:
    """KCLA layers built with ``implementation='compiled'`` (which refuses
    to run while exporting) or ``'fused'`` (which would export its
    per-sample folded conv) run ``'auto'`` meanwhile: the reference
    equations, the export path of :data:`.dispatch.DISPATCH`."""
    from ..models.layers import KCLALayer
    switched = [
        (m, m.implementation) for m in module.modules()
        if isinstance(m, KCLALayer) and m.implementation in ('compiled',
                                                             'fused')
    ]
    for m, _ in switched:
        m.implementation = 'auto'
    try:
        yield
    finally:
        for m, implementation in switched:
            m.implementation = implementation


def writable_temp(out: str) -> str:
    """A fresh temporary file beside ``out``, to be renamed to it.

    Raises:
        ExportError: ``out``'s folder does not exist or cannot be written,
            or ``out`` is a folder.
    """
    folder = osp.dirname(osp.abspath(out))
    if osp.isdir(out):
        raise ExportError(f'output {out} is a folder, not a file name')
    if not osp.isdir(folder):
        raise ExportError(f'output {out}: folder {folder} does not exist')
    try:
        fd, tmp = tempfile.mkstemp(
            dir=folder, prefix=f'.{osp.basename(out)}.', suffix='.tmp')
    except OSError as exc:
        raise ExportError(
            f'output {out} cannot be written: {exc.strerror}') from exc
    os.close(fd)
    return tmp


def dynamic_axes(output_names: Sequence[str],
                 kind: str) -> Dict[str, Dict[int, str]]:
    """Batch and spatial axes of the input and outputs."""
    axes = {'input': {0: 'batch', 2: 'height', 3: 'width'}}
    for name in output_names:
        axes[name] = ({
            0: 'batch'
        } if kind == 'classifier' else {
            0: 'batch',
            2: f'{name}_height',
            3: f'{name}_width'
        })
    return axes


def export_onnx(exportable: Exportable,
                out: str,
                shape: Tuple[int, int],
                batch: int = 1,
                dynamic: bool = False,
                opset: int = DEFAULT_OPSET,
                check: Optional[Callable[[str], Any]] = None) -> str:
    """Writes ``exportable`` to ``out`` with torch's TorchScript-based
    ONNX exporter (the one both supported torch releases have; torch 2.13's
    dynamo exporter is not used), checks it with ``onnx.checker`` and
    ``check`` (called with the written file's path, e.g. a
    :func:`verify_onnx`) and returns ``out``.

    Raises:
        ExportError: the output cannot be written, the model holds an op
            without an ONNX symbolic (named), or ``check`` refuses the
            file; then ``out`` is left as it was.
    """
    import onnx
    if batch < 1 or min(shape) < 1:
        raise ExportError(f'input batch {batch} and size {shape[0]}x'
                          f'{shape[1]}: each must be at least 1')
    x = torch.rand(batch, 3, *shape)
    tmp = writable_temp(out)
    kwargs = {}
    if 'dynamo' in torch.onnx.export.__code__.co_varnames:
        kwargs['dynamo'] = False
    try:
        with torch.no_grad(), export_mode(exportable.module):
            torch.onnx.export(
                exportable.module, (x, ),
                tmp,
                opset_version=opset,
                input_names=['input'],
                output_names=list(exportable.output_names),
                dynamic_axes=dynamic_axes(exportable.output_names,
                                          exportable.kind)
                if dynamic else None,
                do_constant_folding=True,
                **kwargs)
        onnx.checker.check_model(tmp)
        if check is not None:
            check(tmp)
        # mkstemp made it private (0o600): give it what open() would.
        os.chmod(tmp, default_file_mode())
        os.replace(tmp, out)
    except ExportError:
        _remove(tmp)
        raise
    except Exception as exc:  # noqa: B902  the exporters' many error types
        _remove(tmp)
        raise ExportError(
            f'{exportable.description} cannot be exported to ONNX (opset '
            f'{opset}): {first_line(exc)}') from exc
    except BaseException:
        _remove(tmp)
        raise
    return out


def first_line(exc: BaseException) -> str:
    """The head of an exporter's message (the op it stopped at), without
    the graph dump that follows."""
    text = f'{type(exc).__name__}: {exc}'
    return text.split('\n')[0][:500]


def _remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.remove(path)


class Parity(NamedTuple):
    """One comparison of an exported model with PyTorch."""
    input_shape: Tuple[int, ...]
    output: str
    max_abs_diff: float
    scale: float

    @property
    def relative(self) -> float:
        return self.max_abs_diff / max(self.scale, 1e-12)


def verification_shapes(shape: Tuple[int, int], batch: int,
                        dynamic: bool) -> List[Tuple[int, int, int, int]]:
    """The export shape, and with ``dynamic`` another batch size and input
    size (32 and 64 pixels more: divisible as detectors and UNets need),
    and a size divisible by 8 but not by 16 (40 and 72 more), where a
    stage's size changes parity: a graph that recorded a shape-dependent
    step at the export size differs there. :func:`verify_onnx` leaves the
    last out where the PyTorch model itself refuses that size."""
    shapes = [(batch, 3, *shape)]
    if dynamic:
        shapes.append((batch + 1, 3, shape[0] + 32, shape[1] + 64))
        shapes.append((batch, 3, shape[0] + 40, shape[1] + 72))
    return shapes


def compare(module: nn.Module,
            run: Any,
            output_names: Sequence[str],
            input_shapes: Sequence[Tuple[int, ...]],
            tolerance: float = DEFAULT_TOLERANCE,
            seed: int = 0,
            required: Optional[int] = None) -> List[Parity]:
    """Runs ``run(x) -> outputs`` (an exported graph) and ``module`` on
    random inputs of ``input_shapes`` and compares every output. Only the
    first ``required`` shapes (all by default) must run: a later one that
    ``module`` itself refuses in PyTorch (a UNet of mmseg takes sizes
    divisible by 16 only) is left out of the records.

    Raises:
        ExportError: an output differs by more than ``tolerance`` relative
            to its scale, or does not change with the input (recorded as a
            constant).
    """
    gen = torch.Generator().manual_seed(seed)
    records = []
    for i, input_shape in enumerate(input_shapes):
        x = torch.randn(*input_shape, generator=gen)
        with torch.no_grad():
            try:
                want = module(x)
            except Exception:  # noqa: B902  whatever the model raises
                if required is None or i < required:
                    raise
                continue
            got = [torch.as_tensor(g) for g in run(x)]
        if len(got) != len(want):
            raise ExportError(f'the exported graph has {len(got)} outputs, '
                              f'the model {len(want)}')
        for name, g, w in zip(output_names, got, want):
            if g.shape != w.shape:
                raise ExportError(
                    f'output {name} at input {tuple(input_shape)}: shape '
                    f'{tuple(g.shape)} exported, {tuple(w.shape)} in PyTorch')
            record = Parity(
                tuple(input_shape), name, float((g - w).abs().max()),
                float(w.abs().max()))
            if not record.relative <= tolerance:
                raise ExportError(
                    f'output {name} at input {tuple(input_shape)}: max abs '
                    f'difference {record.max_abs_diff:.3g} is '
                    f'{record.relative:.3g} of the output scale '
                    f'{record.scale:.3g} (tolerance {tolerance:g})')
            records.append(record)
        # Same shape, another input: every output must change.
        x2 = torch.randn(*input_shape, generator=gen)
        got2 = [torch.as_tensor(g) for g in run(x2)]
        for name, g, g2 in zip(output_names, got, got2):
            if torch.equal(g, g2):
                raise ExportError(
                    f'output {name} does not change with the input: the '
                    'exported graph recorded it as a constant')
    return records


def onnxruntime_runner(path: str, threads: Optional[int] = None) -> Any:
    """``run(x) -> outputs`` of the ONNX file in onnxruntime's
    CPUExecutionProvider."""
    import onnxruntime as ort
    options = ort.SessionOptions()
    if threads is not None:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    session = ort.InferenceSession(
        path, options, providers=['CPUExecutionProvider'])
    input_name = session.get_inputs()[0].name

    def run(x: Tensor) -> List[Any]:
        return session.run(None, {input_name: x.numpy()})

    return run


def verify_onnx(exportable: Exportable,
                path: str,
                shape: Tuple[int, int],
                batch: int = 1,
                dynamic: bool = False,
                tolerance: float = DEFAULT_TOLERANCE) -> List[Parity]:
    """Compares ``path`` in onnxruntime with ``exportable`` in PyTorch
    (eval, fp32) at :func:`verification_shapes` (see :func:`compare`); the
    records name the shapes compared."""
    return compare(
        exportable.module,
        onnxruntime_runner(path),
        exportable.output_names,
        verification_shapes(shape, batch, dynamic),
        tolerance,
        required=2)


def trace_torchscript(exportable: Exportable,
                      shape: Tuple[int, int],
                      batch: int = 1) -> torch.jit.ScriptModule:
    """``torch.jit.trace`` of ``exportable`` (KCLA's reference equations,
    as for ONNX)."""
    x = torch.rand(batch, 3, *shape)
    with torch.no_grad(), export_mode(exportable.module):
        return torch.jit.trace(exportable.module, (x, ), check_trace=False)


def export_program(exportable: Exportable,
                   shape: Tuple[int, int],
                   batch: int = 1) -> Any:
    """``torch.export.export`` of ``exportable`` at a fixed shape (torch
    >= 2.3)."""
    if not hasattr(getattr(torch, 'compiler', None), 'is_compiling'):
        raise ExportError(
            f'torch.export of KCLA layers needs torch >= 2.3: torch '
            f"{torch.__version__}'s torch.export runs dynamo, which cannot "
            'trace the layer dispatch (use torch.jit.trace or ONNX there)')
    x = torch.rand(batch, 3, *shape)
    with torch.no_grad(), export_mode(exportable.module):
        return torch.export.export(exportable.module, (x, ))


def graph_op_counts(path: str) -> Dict[str, int]:
    """How many nodes of each ONNX op type the file's graph has."""
    import onnx
    counts: Dict[str, int] = {}
    for node in onnx.load(path).graph.node:
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts
