"""Outside probes: promises of the README under faults the other tests do not cover."""
