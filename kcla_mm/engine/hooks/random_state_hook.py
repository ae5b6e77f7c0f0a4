# Copyright (c) kcla_mm contributors. Licensed under the Apache License 2.0.
"""A resumed run that repeats the run it interrupts: random states in every
checkpoint, and loader workers seeded per epoch.

mmengine 0.10.7 restores the weights, optimizer, schedulers and logs on
``--resume`` but no random state: the resumed run draws KCLA's drop path
and mmdet's RPN/RoI samplers from a freshly seeded torch generator, and its
new loader workers start their numpy generators (RandomFlip, crops) where
the interrupted run's persistent workers started epoch 1, not where they
were. :class:`RandomStateHook` closes both gaps; with it, a run resumed from
an epoch-boundary checkpoint equals the uninterrupted run bit for bit on the
CPU.
"""
import logging
import random
from functools import partial
from typing import Any, Callable, Dict, Optional

import numpy as np
import torch
from mmengine.dist import all_gather_object, get_rank, get_world_size
from mmengine.hooks import Hook
from mmengine.logging import print_log
from mmengine.registry import HOOKS
from mmengine.runner import IterBasedTrainLoop
from torch.utils.data import DataLoader

#: The checkpoint key the hook writes.
CHECKPOINT_KEY = 'random_state'
_FORMAT_VERSION = 1


def get_random_state() -> Dict[str, Any]:
    """This process's Python, numpy and torch (and, once CUDA is in use,
    CUDA) random states, as types ``torch.load(weights_only=True)`` reads
    without an allow-list: numpy's MT19937 key as an int64 tensor, the rest
    ints, floats, strings, tuples and uint8 tensors."""
    np_state = np.random.get_state()
    state = dict(
        python=random.getstate(),
        numpy=dict(
            bit_generator=str(np_state[0]),
            key=torch.from_numpy(np_state[1].astype(np.int64)),
            pos=int(np_state[2]),
            has_gauss=int(np_state[3]),
            cached_gaussian=float(np_state[4])),
        torch=torch.get_rng_state())
    # Reading CUDA's states would initialize CUDA; before it is in use its
    # generators are still as seeded, and a resumed run seeds them alike.
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state['cuda'] = torch.cuda.get_rng_state_all()
    return state


def set_random_state(state: Dict[str, Any]) -> None:
    """Sets what :func:`get_random_state` returned (possibly after a
    round trip through a checkpoint, its tensors on any device)."""
    version, internal, gauss_next = state['python']
    random.setstate((version, tuple(internal), gauss_next))
    np_state = state['numpy']
    np.random.set_state(
        (np_state['bit_generator'],
         np_state['key'].cpu().numpy().astype(np.uint32), np_state['pos'],
         np_state['has_gauss'], np_state['cached_gaussian']))
    torch.set_rng_state(state['torch'].cpu())
    cuda = state.get('cuda')
    if cuda is not None:
        devices = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if devices == len(cuda):
            torch.cuda.set_rng_state_all([s.cpu() for s in cuda])
        else:
            print_log(
                f'RandomStateHook: the checkpoint has the random states of '
                f'{len(cuda)} CUDA device(s), this process sees {devices}; '
                'the CUDA generators keep their seeded states',
                logger='current',
                level=logging.WARNING)


def epoch_worker_seed(seed: int, epoch: int, rank: int, worker_id: int) -> int:
    """The seed of loader worker ``worker_id`` of ``rank`` in epoch
    ``epoch`` (0-based): 64 bits from numpy's SeedSequence, so that no two
    (epoch, rank, worker) share a stream."""
    words = np.random.SeedSequence(
        entropy=seed,
        spawn_key=(epoch, rank, worker_id)).generate_state(2, np.uint32)
    return int(words[0]) | int(words[1]) << 32


def _epoch_worker_init(worker_id: int,
                       seed: int,
                       epoch: int,
                       rank: int,
                       user_init: Optional[Callable[[int], Any]] = None):
    """The worker_init_fn the hook gives the train loader: the loader's own
    one (mmengine's or the config's), then Python, numpy and torch seeded
    from :func:`epoch_worker_seed`. Module-level, so that it pickles for
    the spawn start method."""
    if user_init is not None:
        user_init(worker_id)
    worker_seed = epoch_worker_seed(seed, epoch, rank, worker_id)
    random.seed(worker_seed)
    np.random.seed(worker_seed % 2**32)
    torch.manual_seed(worker_seed)


@HOOKS.register_module()
class RandomStateHook(Hook):
    """Saves the random states into each checkpoint and restores them on
    ``--resume``; seeds the train loader's workers per epoch.

    Turn it on in any config (kcla_mm's have it)::

        custom_hooks = [dict(type='RandomStateHook')]

    Main process. At the end of every training epoch (before the
    CheckpointHook saves) the hook takes the Python, numpy, torch and, where
    CUDA is in use, CUDA random states of every rank (one
    ``all_gather_object`` per epoch), writes them into the checkpoints of
    that epoch boundary under ``checkpoint['random_state']``, and sets them
    again at the start of the next epoch. The resumed run sets them at the
    same point, so both start epoch e + 1 from the same states; setting them
    in the uninterrupted run too makes what runs in between (validation,
    whose loader draws from torch's generator) not count. Each rank gets its
    own states back when the world size is the one saved.

    Loader workers. Their generators live in the worker processes, so they
    cannot be saved; persistent workers carry them across epochs, which a
    resumed run's new workers cannot repeat. In an epoch-based loop with
    ``num_workers > 0`` the hook therefore gives the train loader, at the
    start of each epoch, a ``worker_init_fn`` that runs the loader's own
    one and then seeds Python, numpy and torch from (seed, epoch, rank,
    worker id) (:func:`epoch_worker_seed`), and shuts down the previous
    epoch's persistent workers so that new ones start with it. What the
    workers need to repeat an epoch is then the seed and the epoch, which
    every checkpoint has. The cost is one worker start per epoch, as
    without ``persistent_workers`` (stopping one took 20 ms here). (A side
    effect: the workers' augmentations differ from epoch to epoch also
    without persistent workers, where mmengine seeds every epoch's workers
    alike.)

    Checkpoints saved elsewhere than at an epoch boundary (iteration-based
    loops, ``by_epoch=False`` checkpoints) hold the saving rank's states,
    set again before the next iteration in both runs. An iteration-based
    loop keeps its workers (it builds its iterator once and, resuming,
    replays the skipped batches through them, which repeats their
    generators); with ``num_workers=0`` the replay runs the pipeline in the
    main process, so there the resumed run's data augmentation differs.

    A resumed checkpoint without the key (saved without this hook) resumes
    with a warning and freshly seeded states. Loading weights with
    ``load_from`` (not a resume) restores nothing.

    Args:
        reseed_workers (bool): Seed the train loader's workers per epoch as
            above. Defaults to True.
    """

    priority = 'VERY_HIGH'

    def __init__(self, reseed_workers: bool = True) -> None:
        self.reseed_workers = reseed_workers
        # The iteration count at the end of the last epoch and every rank's
        # states there.
        self._boundary: Optional[Dict[str, Any]] = None
        # States to set at the next epoch start / iteration.
        self._set_at_epoch: Optional[Dict[str, Any]] = None
        self._set_at_iter: Optional[Dict[str, Any]] = None
        # What a loaded checkpoint held, until before_train decides whether
        # it was a resume.
        self._loaded: Optional[Dict[str, Any]] = None
        self._loader_init: Dict[int, Optional[Callable]] = {}

    # Saving.
    def after_train_epoch(self, runner) -> None:
        self._boundary = dict(
            iter=runner.iter, ranks=all_gather_object(get_random_state()))
        self._set_at_epoch = self._boundary['ranks'][get_rank()]

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        boundary = self._boundary
        # No iteration since the epoch ended: the epoch's checkpoint, or
        # one saved after validation (the best one, whose meta counts one
        # iteration more).
        epoch_end = boundary is not None and runner.iter == boundary['iter']
        if epoch_end:
            ranks = boundary['ranks']
        else:
            # Only the saving rank is here (mmengine saves on rank 0).
            ranks = [get_random_state()]
            self._set_at_iter = ranks[0]
        checkpoint[CHECKPOINT_KEY] = dict(
            version=_FORMAT_VERSION,
            epoch_end=epoch_end,
            world_size=get_world_size(),
            ranks=ranks)

    # Restoring.
    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        meta = checkpoint.get('meta', {})
        self._loaded = dict(
            epoch=meta.get('epoch'),
            iter=meta.get('iter'),
            state=checkpoint.get(CHECKPOINT_KEY))

    def before_train(self, runner) -> None:
        loaded, self._loaded = self._loaded, None
        # Runner.resume puts the loop where the checkpoint was; load_from
        # leaves it at the start.
        if loaded is None or (runner.epoch, runner.iter) != (
                loaded['epoch'], loaded['iter']) or (runner.epoch,
                                                     runner.iter) == (0, 0):
            return
        saved = loaded['state']
        if saved is None:
            print_log(
                'RandomStateHook: the resumed checkpoint has no '
                f"'{CHECKPOINT_KEY}' (it was saved without RandomStateHook);"
                ' the run continues from freshly seeded random states and '
                'will not repeat the run it resumes',
                logger='current',
                level=logging.WARNING)
            return
        rank, world_size = get_rank(), get_world_size()
        if saved['world_size'] != world_size:
            print_log(
                f'RandomStateHook: the checkpoint was saved by '
                f"{saved['world_size']} process(es), this run has "
                f'{world_size}; each rank restores the states of the rank '
                'of its number where there is one',
                logger='current',
                level=logging.WARNING)
        if rank >= len(saved['ranks']):
            print_log(
                f'RandomStateHook: the checkpoint has no random state for '
                f'rank {rank}; it continues from its seeded states',
                logger='current',
                level=logging.WARNING)
            return
        if saved['epoch_end']:
            self._set_at_epoch = saved['ranks'][rank]
        else:
            self._set_at_iter = saved['ranks'][rank]

    def before_train_epoch(self, runner) -> None:
        if self._set_at_epoch is not None:
            set_random_state(self._set_at_epoch)
            self._set_at_epoch = None
        if self.reseed_workers:
            self._seed_loader_workers(runner)

    def before_train_iter(self,
                          runner,
                          batch_idx: int,
                          data_batch: Any = None) -> None:
        if self._set_at_iter is not None:
            set_random_state(self._set_at_iter)
            self._set_at_iter = None

    def after_train(self, runner) -> None:
        # The last epoch's workers: not left to the garbage collector, whose
        # DataLoader.__del__ can wait seconds on them.
        if self.reseed_workers and self._loader_workers(runner) is not None:
            _shutdown_persistent_workers(runner.train_loop.dataloader)

    @staticmethod
    def _loader_workers(runner) -> Optional[DataLoader]:
        """The train loader whose workers the hook seeds, or None."""
        loop = runner.train_loop
        loader = getattr(loop, 'dataloader', None)
        if (isinstance(loop, IterBasedTrainLoop)
                or not isinstance(loader, DataLoader)
                or loader.num_workers == 0):
            return None
        return loader

    def _seed_loader_workers(self, runner) -> None:
        loader = self._loader_workers(runner)
        if loader is None:
            return
        # The loader's own worker_init_fn, kept once (the hook replaces it).
        user_init = self._loader_init.setdefault(
            id(loader), loader.worker_init_fn)
        loader.worker_init_fn = partial(
            _epoch_worker_init,
            seed=runner.seed,
            epoch=runner.epoch,
            rank=get_rank(),
            user_init=user_init)
        # The next iter() starts workers with the new worker_init_fn.
        _shutdown_persistent_workers(loader)


def _shutdown_persistent_workers(loader: DataLoader) -> None:
    """Stops the workers a ``persistent_workers`` loader keeps (in its
    ``_iterator``, torch 2.0 to 2.13); its next iter() starts new ones."""
    iterator: Optional[Any] = getattr(loader, '_iterator', None)
    if iterator is not None:
        shutdown = getattr(iterator, '_shutdown_workers', None)
        if shutdown is not None:
            shutdown()
        loader._iterator = None
