"""The in-pod agent (standard library only): arrives at epochs, holds the barrier, stops and
starts the trainer."""
