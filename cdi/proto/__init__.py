"""cdi/proto."""
