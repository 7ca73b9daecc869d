"""The GangJob controller: observe the cluster, plan in pure code, act through one API adapter."""
