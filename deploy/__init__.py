"""Deploying cdiflow: its images, the stack as containers, and the Kubernetes manifests.

Part of a source checkout (like ``loadtest``), not of the installed package: building the
images needs the checkout's lock, the minion's sources and the Containerfiles here.
"""
