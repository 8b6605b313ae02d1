"""What operators read and are warned of: system checks, the queue overview, table health, stranded
tasks, metrics."""
