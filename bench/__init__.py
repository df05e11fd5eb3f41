"""fencelock's benchmarks against the libraries it must beat, in one run: `python -m bench [--quick] [--json PATH]`.

    contenders.py   the registry: name -> factory giving acquire/release callables (add Redlock, etcd, ... here)
    services.py     starts the servers the chosen contenders need (one Redis today), shared by every row
    workload.py     the workloads: uncontended acquire+release, and contended hand-off between processes
    stats.py        medians, percentiles, overlap and hand-off-gap counting
    report.py       the machine, the tables, the targets (PASS/FAIL) and the JSON file
    cli.py          the command line: what runs, in which order

It is a benchmark, not a test: it starts its own servers and always measures every contender against the same
server in the same run, so the ratios mean something even when the absolute numbers move between machines.
"""
