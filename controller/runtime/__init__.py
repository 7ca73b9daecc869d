"""The controller's runtime machinery, free of Kubernetes and of policy: the clock, the work
queue, metrics, tracing and the probe/metrics HTTP server."""
