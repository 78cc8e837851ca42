from .dataloader import DataLoader, get_worker_info  # noqa: F401
from .dataset import Dataset, IterableDataset  # noqa: F401
