"""The application-side CDI API."""

from cdi.client.client import CDIObject, Client, connect

__all__ = ["CDIObject", "Client", "connect"]
