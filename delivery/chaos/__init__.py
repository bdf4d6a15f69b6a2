"""The chaos run (`scripts/chaos.py`): the whole platform as real processes under injected faults.

    receivers  loopback HTTP receivers with programmed behaviour; they verify and count
    cluster    PostgreSQL, Redis, API and worker processes, and the faults done to them
    faults     the seeded fault schedule and its injector
    workload   accounts, endpoints, sends, retries, deletions, replays and expunges through the SDK
    erasure    the retention job through the window, and the checks that erasure touched nothing live
    checks     what must hold once everything drained: audit, liveness, receipts, credits
    operational_checks  each operational event against its cause, each one sent received
    run        the command line: sizes, orchestration, the summary
"""
