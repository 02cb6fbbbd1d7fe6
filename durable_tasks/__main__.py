"""``python -m durable_tasks`` is the ``durable-tasks`` command."""

from .cli import main

main()
