"""Paddock Studio: a desktop app and local API for open LLMs, on an inference engine of its own."""

__version__ = "0.1.0"
