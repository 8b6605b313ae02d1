"""Running several worker processes (tasks_worker --processes N): the supervisor, its database
writes, the health file. A single worker process imports nothing from here."""
