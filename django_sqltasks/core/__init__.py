"""Rules with no database and no backend: options and per-alias settings, schedules, task
resolution, limits, workflow plans, serialization, column lengths. Imports only compat, ids,
indexes and exceptions."""
