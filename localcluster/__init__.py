"""Builds and runs a real local Kubernetes: etcd, apiserver, controller-manager, scheduler,
KWOK and a real kubelet."""
