"""The `hookledger` command: main builds the typer app; the commands that call the API go through
the SDK (client_commands), the operator's through the API or PostgreSQL (operator_commands), and
`hookledger listen` is a local receiver (listen). The top layer: it may import every part.
"""

from delivery.cli.main import app, main

__all__ = ["app", "main"]
