"""Datasets, synthetic generators and one-time preprocessing shared by the data modules."""
