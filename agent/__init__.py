"""The in-pod agent: standard library only. Arrives at epochs, holds the barrier, stops and starts the trainer."""
