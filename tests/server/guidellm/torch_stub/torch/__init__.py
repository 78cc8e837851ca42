"""The part of torch that guidellm 0.8.1 touches when it reads a prompts file, for its test
(tests/server/test_guidellm.py): not torch.

guidellm imports ``torch`` to subclass ``torch.utils.data.DataLoader`` (its only data loader,
used as an iterator of collated items), seed a ``torch.Generator`` and let ``datasets``
check ``isinstance(x, torch.Tensor)``. Installing torch for that would pull 0.75 GB (CPU) to
4 GB (CUDA). This package is put on guidellm's PYTHONPATH only; the HTTP client, scheduler,
timings and token accounting the test reads are guidellm's own. An in-process loader,
batch_size items at a time, in order (or shuffled by the generator's seed).
"""

from . import utils  # noqa: F401

__version__ = "0.0.0+guidellm-test-stub"


class Generator:
    def __init__(self, *args: object, **kwargs: object) -> None:
        self.seed = 0

    def manual_seed(self, seed: int) -> "Generator":
        self.seed = int(seed)
        return self


class Tensor:
    """Never made: datasets only asks whether values are tensors."""


class _Module:
    pass


class nn:  # noqa: N801 - torch's own name
    Module = _Module
