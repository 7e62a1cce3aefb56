"""cdi/minion."""
