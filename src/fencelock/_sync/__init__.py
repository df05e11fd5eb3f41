"""The synchronous implementation, generated from `_async/` by `scripts/unasync.py`: do not edit these files.

Only `_compat.py` (and this docstring) is written by hand, as the twin of `_async/_compat.py`.
"""
