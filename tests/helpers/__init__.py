"""Plain helpers the test modules share: constants, functions and classes, no fixtures (those live in conftest.py)."""
