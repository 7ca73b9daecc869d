"""GangJob's Python client: submit distributed training as a GangJob, wait for it, stream its
logs, restart its gang, delete it (`Client`; `AsyncClient` for asyncio code).

    from gangjob import Client
    client = Client()                      # your kubeconfig, its context's namespace
    job = client.submit(image="my/trainer:1", workers=2, command=["torchrun", "train.py"])
    job = client.wait(job.name)            # a `Job`: phase, epoch, restarts, step, goodput...
"""

from controller.k8s import ApiError, NotFound
from gangjob.client import AsyncClient, Client, JobError, context_namespace
from gangjob.model import TERMINAL, Job
from gangjob.spec import SpecError

__all__ = [
    "TERMINAL",
    "ApiError",
    "AsyncClient",
    "Client",
    "Job",
    "JobError",
    "NotFound",
    "SpecError",
    "context_namespace",
]
