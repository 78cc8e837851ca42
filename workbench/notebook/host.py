"""What the `%wb` subcommands (commands.py, cluster_commands.py) use of the magics that call
them: `magics.WorkbenchMagics` is one. A Protocol here, so those modules need not import the
magics that import them (no import cycle)."""

from __future__ import annotations

from typing import Any, Protocol



class MagicsHost(Protocol):
    current_model: str | None      # the model the magics use; a subcommand may set it

    def cache_of(self, args: Any) -> Any:
        """The cache a subcommand's --model / --cache arguments name (default: the current model's)."""
        ...

    def row_key(self, cache: Any, key: str) -> str:
        """A row's full key from a unique prefix of it."""
        ...
