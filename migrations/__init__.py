"""Alembic migrations. They import the table definitions (billing.tables) and nothing else of ours."""
