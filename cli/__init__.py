"""`gangjob`, the command line of an ML engineer: submit a GangJob, follow its status and its
trainers' logs, ask for a gang restart, delete it (`gangjob --help`)."""
