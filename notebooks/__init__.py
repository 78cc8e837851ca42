"""Not code: the tutorial notebooks. This file makes pytest import notebooks/conftest.py as
`notebooks.conftest`, so it does not replace tests/conftest.py as the module `conftest`
(which tests import from)."""
