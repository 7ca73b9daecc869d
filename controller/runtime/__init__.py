"""The controller's runtime machinery, free of Kubernetes and of policy: the clock, the work
queue, metrics, tracing, the probes/metrics application and the HTTP server that serves it,
the garbage collector's pace."""
