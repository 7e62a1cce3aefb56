"""Applications bundled with cdiflow that use the CDI runtime directly (``apps.ar``)."""
