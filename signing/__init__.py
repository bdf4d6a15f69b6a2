"""Standard Webhooks signing and verification. Pure: imports nothing of ours."""
