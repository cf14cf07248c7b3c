"""Measurement: where each training step's time goes, and the run summary."""
