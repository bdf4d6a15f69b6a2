#!/usr/bin/env python3
"""Audit the ledger: the same code as `hookledger audit` (flags: --account ID, --json)."""

import sys

from delivery.cli.main import app

if __name__ == "__main__":
    sys.exit(app(["audit", *sys.argv[1:]]))
