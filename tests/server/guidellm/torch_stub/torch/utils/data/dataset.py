from typing import Generic, TypeVar

T = TypeVar("T")


class Dataset(Generic[T]):
    pass


class IterableDataset(Dataset[T]):
    pass
