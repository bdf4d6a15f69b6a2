"""How the platform is put together and run: configuration from the environment, the servers
(configured or embedded), the database pool and migrations, the web app (API and dashboard),
the `hookledger api` and `hookledger worker` processes, and `hookledger run` with its demo.
It sits above every other part of delivery but the CLI and the chaos harness.
"""
