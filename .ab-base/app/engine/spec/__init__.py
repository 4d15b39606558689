"""Speculative decoding: drafters propose tokens, one step verifies them (core/engine.py)."""
