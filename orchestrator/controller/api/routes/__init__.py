"""One module per resource; ``orchestrator.controller.api.main`` mounts them."""
