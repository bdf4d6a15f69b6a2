"""Operator work: account deletion (bulk settle and close-out) and its repair, dead letters and
their replay, the audit report, and the sender of operational events (operational_sender). Imports
the engine and the store; never an interface.
"""
