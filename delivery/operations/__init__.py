"""Operator work: account deletion (bulk settle and close-out) and its repair, dead letters and
their replay, the audit report. Imports the engine and the store; never an interface.
"""
