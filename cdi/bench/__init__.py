"""cdi/bench."""
