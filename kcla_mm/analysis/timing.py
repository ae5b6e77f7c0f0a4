# Copyright (c) kcla_mm contributors. Licensed under the Apache License 2.0.
"""Alternating latency measurement shared by the benchmark tools.

Models are run in turn, iteration by iteration, so that the noise of a
shared machine hits them alike; the callers take medians or minima. The
models may live in one process or each in its own
(:class:`kcla_mm.analysis.benchmark.ModelProcess`).
"""
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

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


def train_step(inputs: Tensor,
               between: Optional[Callable[[], None]] = None) -> Step:
    """One train-mode forward and backward of the mean of every output;
    ``between``, where given, is called after the forward pass and before
    the backward one (to tell their costs apart)."""

    def step(model: nn.Module) -> None:
        model.train()
        model.zero_grad(set_to_none=True)
        loss = sum(o.mean() for o in model(inputs))
        if between is not None:
            between()
        loss.backward()

    return step


def alternating_runs(runners: Dict[str, Callable[[str], float]],
                     kinds: Sequence[str], warmup: int,
                     repeats: int) -> Dict[Tuple[str, str], List[float]]:
    """Seconds of each (runner name, step kind) over ``repeats`` rounds
    after ``warmup`` rounds; a round calls every runner once per kind, and
    a runner runs that step and returns its seconds (in this process, or
    measured in another that holds the model)."""
    times = {(name, kind): [] for name in runners for kind in kinds}
    for i in range(warmup + repeats):
        for name, runner in runners.items():
            for kind in kinds:
                seconds = runner(kind)
                if i >= warmup:
                    times[(name, kind)].append(seconds)
    return times


def timed_step(step: Step, model: nn.Module, device: str = 'cpu') -> float:
    """Seconds of ``step(model)``; CUDA is synchronised around it."""
    cuda = device.startswith('cuda')
    if cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    step(model)
    if cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - start


def model_runners(models: Dict[str, nn.Module],
                  steps: Dict[str, Step],
                  device: str = 'cpu') -> Dict[str, Callable[[str], float]]:
    """The runners of :func:`alternating_runs` for models in this process:
    by name, a function of the step's name that runs that step of
    ``steps`` on the model and returns its seconds (:func:`timed_step`)."""

    def runner(model: nn.Module) -> Callable[[str], float]:
        return lambda kind: timed_step(steps[kind], model, device)

    return {name: runner(model) for name, model in models.items()}


def alternating_times(
        models: Dict[str, nn.Module],
        steps: Dict[str, Step],
        warmup: int,
        repeats: int,
        device: str = 'cpu') -> Dict[Tuple[str, str], List[float]]:
    """Seconds of each (model name, step name) over ``repeats`` rounds after
    ``warmup`` rounds; a round runs every step of every model once, all in
    this process."""
    return alternating_runs(
        model_runners(models, steps, device), list(steps), warmup, repeats)
