import random
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

T = TypeVar("T")


def get_worker_info() -> None:
    return None  # always the main process


class DataLoader(Generic[T]):
    """In-process: collate_fn(batch) for each batch_size items of the dataset."""

    def __init__(self, dataset: Any, batch_size: int = 1, shuffle: bool = False,
                 collate_fn: Callable[[list[Any]], Any] | None = None, num_workers: int = 0,
                 prefetch_factor: int | None = None, generator: Any = None, **kwargs: Any) -> None:
        self.dataset, self.batch_size, self.shuffle = dataset, batch_size, shuffle
        self.collate_fn = collate_fn or (lambda b: b)
        self.num_workers, self.generator = num_workers, generator

    def __iter__(self) -> Iterator[Any]:
        items: Any = iter(self.dataset)
        if self.shuffle:
            items = list(items)
            random.Random(getattr(self.generator, "seed", 0)).shuffle(items)
        batch: list[Any] = []
        for item in items:
            batch.append(item)
            if len(batch) == self.batch_size:
                yield self.collate_fn(batch)
                batch = []
        if batch:
            yield self.collate_fn(batch)
