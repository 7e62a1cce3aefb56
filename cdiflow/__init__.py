"""cdiflow."""
