"""Shipped recipes, eval suites and gates (YAML), installed as package data."""
