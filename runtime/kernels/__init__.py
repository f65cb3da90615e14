"""Kernels behind the runtime layers. reference.py is the torch path every device can run."""
