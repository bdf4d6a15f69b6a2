"""The money: accounts, the ledger, charging on create, the one settle function, audits.

Imports nothing of `delivery`. `billing.settle` is the one place where delivery state and
money meet, by design: it writes the `deliveries` table by SQL.
"""
