"""Calibration and evaluation data: readers, records, sampling and the coverage report."""
