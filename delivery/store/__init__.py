"""What the engine and the interfaces both read and write: endpoint storage, the cache of opened
signing keys, operational endpoints and events (operational), the API's stored idempotent answers,
and which driver errors mean PostgreSQL went away. The lowest layer of delivery: imports billing,
signing and the root modules only.
"""
