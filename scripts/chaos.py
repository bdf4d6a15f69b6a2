#!/usr/bin/env python3
"""Chaos run: the whole platform as real processes under injected faults, then every invariant checked.

    .venv/bin/python scripts/chaos.py --short [--seed N] [--summary PATH]
    .venv/bin/python scripts/chaos.py --long  [--seed N] [--summary PATH]    # 100,000 deliveries, manual

Embedded PostgreSQL and Redis of the run's own when DATABASE_URL / REDIS_URL are unset (then
every fault runs, PostgreSQL restarts included). Exits 0 only if every check holds. The logic
lives in delivery/chaos/.
"""

import sys

from delivery.chaos.run import main

if __name__ == "__main__":
    sys.exit(main())
