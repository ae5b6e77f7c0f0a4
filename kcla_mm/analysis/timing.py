# Copyright (c) kcla_mm contributors. Licensed under the Apache License 2.0.
"""Alternating latency measurement shared by the benchmark tools.

Models are run in turn, iteration by iteration, so that the noise of a
shared machine hits them alike; the callers take medians or minima.
"""
import time
from typing import Callable, Dict, List, Tuple

import torch
import torch.nn as nn
from torch import Tensor

Step = Callable[[nn.Module], None]


def eval_step(inputs: Tensor) -> Step:
    """One eval-mode forward without autograd."""

    def step(model: nn.Module) -> None:
        model.eval()
        with torch.no_grad():
            model(inputs)

    return step


def train_step(inputs: Tensor) -> Step:
    """One train-mode forward and backward of the mean of every output."""

    def step(model: nn.Module) -> None:
        model.train()
        model.zero_grad(set_to_none=True)
        sum(o.mean() for o in model(inputs)).backward()

    return step


def alternating_times(
        models: Dict[str, nn.Module],
        steps: Dict[str, Step],
        warmup: int,
        repeats: int,
        device: str = 'cpu') -> Dict[Tuple[str, str], List[float]]:
    """Seconds of each (model name, step name) over ``repeats`` rounds after
    ``warmup`` rounds; a round runs every step of every model once."""
    cuda = device.startswith('cuda')
    times = {(name, kind): [] for name in models for kind in steps}
    for i in range(warmup + repeats):
        for name, model in models.items():
            for kind, step in steps.items():
                if cuda:
                    torch.cuda.synchronize()
                start = time.perf_counter()
                step(model)
                if cuda:
                    torch.cuda.synchronize()
                if i >= warmup:
                    times[(name, kind)].append(time.perf_counter() - start)
    return times
