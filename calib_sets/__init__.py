"""Shipped business-representative calibration sets, installed as package data.

Each set is a folder with train.jsonl, eval.jsonl (held out) and a data card README.md.
"""
