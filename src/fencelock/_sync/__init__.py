"""The synchronous implementation, generated from `_async/` by `scripts/unasync.py`: do not edit these files.

Only the modules named in `scripts/unasync.py`'s HAND_WRITTEN (and this docstring) are written by hand, each the
twin of the `_async/` module of the same name; `_multiplex.py` is the deliberate sync-only fork (a select loop).
"""
