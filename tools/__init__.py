"""Developer scripts run from the checkout (each says how in its docstring)."""
