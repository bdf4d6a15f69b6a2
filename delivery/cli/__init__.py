"""The `hookledger` command: main builds the typer app; the commands that call the API go through
the SDK (client_commands), the operator's through the API or, for the three that need it, PostgreSQL
(operator_commands), expunge and the payload retention (retention_commands); common holds their
shared options and checks, output how they print, and `hookledger listen` is a local receiver (listen). The top layer: it may import every part.
"""

from delivery.cli.main import app, main

__all__ = ["app", "main"]
