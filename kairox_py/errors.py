"""The one exception type kairox_py raises for user-facing failures.

Callers (the CLI above all) catch exactly this to turn a failure into a one-line message;
anything else escaping is a bug. It lives in its own module so that code which never
touches the native library (GGUF inspection, model download) can raise it without
importing ctypes bindings.
"""
from __future__ import annotations


class KairoxError(RuntimeError):
    """A failure the user can act on: bad input, missing build, failed download, ..."""
