# Copyright (c) kcla_mm contributors. Licensed under the Apache License 2.0.
"""Deployment: ONNX / TorchScript / torch.export of kcla_mm models
(:mod:`.onnx_export`; ``tools/deployment/pytorch2onnx.py``). Needs the
``deploy`` extra (onnx, onnxruntime, onnxscript) for ONNX."""
from .onnx_export import (DEFAULT_OPSET, DEFAULT_TOLERANCE, Exportable,
                          ExportError, Parity, build_exportable, compare,
                          export_onnx, export_program, graph_op_counts,
                          onnxruntime_runner, trace_torchscript,
                          verification_shapes, verify_onnx)

__all__ = [
    'DEFAULT_OPSET', 'DEFAULT_TOLERANCE', 'ExportError', 'Exportable',
    'Parity', 'build_exportable', 'compare', 'export_onnx', 'export_program',
    'graph_op_counts', 'onnxruntime_runner', 'trace_torchscript',
    'verification_shapes', 'verify_onnx'
]
