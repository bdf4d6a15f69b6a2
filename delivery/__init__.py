"""Everything that moves webhooks: API, worker, sender, CLI, SDK. Imports billing and signing."""
