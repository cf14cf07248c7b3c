"""Argoverse 2 motion forecasting: format constants, real-format loader, synthetic generator, dataset."""
