"""The fault lab: its checker, every fault type end to end, and its report."""
