"""Training under a launcher: ``torchrun`` or ``accelerate launch`` runs one process per device.

    accelerate launch --num_processes 8 -m dreamgym_agents.cli train-experience DATA --out DIR
    torchrun --nproc_per_node 8 -m dreamgym_agents.cli train-experience DATA --out DIR

A launcher sets ``WORLD_SIZE`` and ``RANK`` in every process; everything else here follows from
them. Data is prepared once, by the main process (rank 0), and handed to the others
(:func:`shared`): the buffer is one Chroma store whose approximate search is not bit-stable, and
every process must train on the same examples. Every process trains its share of each batch (HF's
Trainer wraps the model in DistributedDataParallel, gradients are averaged); only the main
process writes the model, its manifest and its logs (:func:`is_main`). After training the
processes compare their weights (:func:`check_weights_agree`): a model whose gradients were not
synchronised would differ between them, and that is an error, not a saved model.

Without a launcher (one process) every function here is a no-op that returns what it is given.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from dreamgym_agents.errors import DreamGymError

logger = logging.getLogger(__name__)

T = TypeVar("T")


def world_size() -> int:
    """How many processes the launcher started (1: no launcher)."""
    return int(os.environ.get("WORLD_SIZE", "1") or 1)


def rank() -> int:
    """This process's rank (0: the main process, or no launcher)."""
    return int(os.environ.get("RANK", "0") or 0)


def is_main() -> bool:
    """Whether this process writes what the run saves (rank 0)."""
    return rank() == 0


def start(device: str) -> None:
    """Join the launcher's process group on ``device`` (``cuda``: NCCL; ``cpu``: gloo), as HF's
    Trainer will (the same accelerate state); a no-op without a launcher or once joined."""
    if world_size() < 2:
        return
    from accelerate import PartialState

    PartialState(cpu=device == "cpu")


def barrier(device: str) -> None:
    """Wait until every process gets here (a no-op without a launcher)."""
    if world_size() < 2:
        return
    start(device)
    from accelerate import PartialState

    PartialState().wait_for_everyone()


@contextlib.contextmanager
def main_first(device: str) -> Iterator[None]:
    """Run the block in the main process first, then in the others (files the main process
    writes, such as a new tokenizer, are there when the others read them)."""
    if world_size() < 2:
        yield
        return
    if not is_main():
        barrier(device)
    yield
    if is_main():
        barrier(device)


def shared(make: Callable[[], T], device: str) -> T:
    """``make()`` computed by the main process only and handed to every process (pickled)."""
    if world_size() < 2:
        return make()
    start(device)
    from accelerate.utils import broadcast_object_list

    box: list[Any] = [make() if is_main() else None]
    broadcast_object_list(box, from_process=0)
    return box[0]


def any_process(flag: bool, device: str) -> bool:
    """Whether ``flag`` holds in any process: a decision every process must take together,
    such as stopping at a time budget, where one process stepping on alone would wait for
    ever."""
    if world_size() < 2:
        return flag
    import torch
    import torch.distributed as dist

    start(device)
    value = torch.tensor([int(flag)], device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())


class WeightsDisagree(DreamGymError):
    """The processes of one training run ended with different weights."""


def check_weights_agree(model: Any, device: str) -> None:
    """Raise :class:`WeightsDisagree` unless every process holds the same weights (a sum of
    each parameter, compared across processes; a no-op without a launcher)."""
    if world_size() < 2:
        return
    import torch
    from accelerate.utils import gather_object

    start(device)
    with torch.no_grad():
        mine = [float(p.detach().double().sum()) for p in model.parameters()]
    everyone = gather_object([mine])
    if any(theirs != everyone[0] for theirs in everyone[1:]):
        raise WeightsDisagree("the training processes ended with different weights: their "
                              "gradients were not synchronised")
    logger.info("the %d training processes hold the same weights", len(everyone))
