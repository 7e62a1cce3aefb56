"""cdiflow as containers, with podman: its images built here (``images``), the whole stack on
two or more hosts (``stack``), the faults struck at it (``faults``) and the Kubernetes
manifests played (``kube``). ``cdiflow containers --help`` lists the commands."""
