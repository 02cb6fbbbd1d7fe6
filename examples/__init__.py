"""Runnable examples built on the public durable_tasks API."""
