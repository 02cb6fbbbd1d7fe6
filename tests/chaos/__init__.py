"""Chaos harness for durable_tasks: real processes, real servers, injected faults, a checker.

``python -m tests.chaos`` runs the full set; ``pytest tests/chaos`` runs the reduced set.
See docs/reliability.md.
"""
