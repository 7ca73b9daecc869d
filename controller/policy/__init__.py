"""The controller's policy, pure: typed views of what was observed, failure classification,
the worker pods' shape, and `plan` with one module per policy. No I/O, no Kubernetes client."""
