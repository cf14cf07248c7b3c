"""Checkpoint I/O: atomic writes, latency measured per save."""
