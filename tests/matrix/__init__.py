"""The fault matrix (see test_matrix.py)."""
