"""Engine fixtures live in engine_helpers.py, importable by the tests beside them."""

from engine_helpers import arq_queue, keyring, receiver_factory, settings  # noqa: F401
