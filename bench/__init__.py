"""fencelock's benchmarks against the libraries it must beat, in one run: `python -m bench [--quick] [--json PATH]`
(`--only redlock,fencelock` limits a run to the Redlock rows and the single-node row they are compared with;
`--only watchdog` to the renewal watchdog section).

    contenders/     the registry: name -> factory giving acquire/release callables, one module per service
                    (one Redis, Redlock, etcd and ZooKeeper), fencelock's own factories apart
    services.py     starts the servers the chosen contenders need (one Redis; N independent Redlock nodes)
    workload.py     the workloads: uncontended acquire+release, and contended hand-off between processes
    watchdog.py     the renewal watchdog section: 10,000 renewed leases in a process of their own (CPU, script
                    calls and round trips per 100 renewals, leases lost, how promptly the process exits)
    front_ends.py   the sync client against the asyncio client run on a loop thread (`--only front_ends`)
    stats.py        medians, percentiles, overlap and hand-off-gap counting
    report.py       the machine, the tables, a check's verdict and the JSON file
    targets.py      the ratios judged against their targets (PASS/FAIL); latency_report.py,
                    watchdog_report.py, events_report.py: the same for those sections
    cli.py          the command line: what runs, in which order

It is a benchmark, not a test: it starts its own servers and always measures every contender against the same
server in the same run, so the ratios mean something even when the absolute numbers move between machines.
"""
