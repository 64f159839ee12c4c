"""bitsandbytes 0.50.2 as a reference, imported quietly (it warns on stderr without a GPU)."""

import contextlib
import io
import warnings

with contextlib.redirect_stderr(io.StringIO()), warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import bitsandbytes as bnb  # noqa: F401
    import bitsandbytes.functional as bnbF  # noqa: F401

__all__ = ["bnb", "bnbF"]
