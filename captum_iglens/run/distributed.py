"""The processes of a run, as accelerate (or torchrun) started them.

``accelerate launch`` and ``torchrun`` set ``WORLD_SIZE``/``RANK`` in each process's
environment; accelerate's ``PartialState`` then joins the process group (gloo on CPU, NCCL
on GPUs) and names this process's device. A plain ``python``/``iglens`` run is one process.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable

import torch

__all__ = ["Processes", "processes"]


@dataclass
class Processes:
    """This process's place in the run.

    Attributes:
        rank (int): From 0.
        world_size (int): Number of processes.
        device (torch.device): The device accelerate assigned to this process.
        barrier (callable): Waits until every process reaches it.
    """

    rank: int
    world_size: int
    device: torch.device
    barrier: Callable[[], None]

    @property
    def is_main(self) -> bool:
        """Rank 0, which merges the output and prints the summary."""
        return self.rank == 0


def processes() -> Processes:
    """The processes of this run: accelerate's state when launched with several, else one.

    Raises:
        ImportError: several processes were launched but accelerate is not installed.
    """
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return Processes(0, 1, torch.device("cpu"), lambda: None)
    from accelerate import PartialState

    # Without an accelerator, accelerate joins the group only when told it runs on CPUs.
    state: Any = PartialState(cpu=not torch.cuda.is_available())
    return Processes(int(state.process_index), int(state.num_processes),
                     torch.device(state.device), state.wait_for_everyone)
