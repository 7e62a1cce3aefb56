"""The systems the workflow benchmark starts, drives and stops (see ``loadtest.runner``)."""
