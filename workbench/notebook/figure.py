"""The Figure every workbench plot returns: matplotlib's own `Figure`, which also shows itself
as a PNG in IPython, so a plot returned by a cell appears as a picture with or without
`%matplotlib inline` and whatever the matplotlib backend.

The figures are built without pyplot (nothing is kept in pyplot's state, nothing shown
twice), so matplotlib's inline backend, which registers its display formatter for `Figure`
when it is activated (`%matplotlib inline`, or an `import matplotlib.pyplot` under the
kernel's default backend), may never be. No formatter is registered here and no backend set:
IPython asks `_repr_png_` only when no formatter is registered for the type, so where the
inline backend is active its formatter draws the figure exactly as before (once), and a
user's own figures are left as they were. The class keeps the name `Figure`, so the text
repr (`<Figure size 700x400 with 1 Axes>`) is matplotlib's.
"""

from __future__ import annotations

import base64
import io

from matplotlib.figure import Figure as _MatplotlibFigure


class Figure(_MatplotlibFigure):
    """A `matplotlib.figure.Figure` with a PNG repr for IPython's display."""

    def _repr_png_(self) -> str | None:
        """The figure as base64 PNG (as the inline backend's formatter gives it: cropped to
        what is drawn); None for a figure with nothing drawn, which then shows as text."""
        if not self.axes and not self.lines and not self.texts and not self.images:
            return None
        buf = io.BytesIO()
        self.savefig(buf, format="png", bbox_inches="tight", facecolor=self.get_facecolor(),
                     edgecolor=self.get_edgecolor())
        return base64.b64encode(buf.getvalue()).decode("ascii")
