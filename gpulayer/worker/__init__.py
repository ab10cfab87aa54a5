"""The worker: an RQ worker that runs GPUlayer jobs, several at once."""

from .worker import Worker

__all__ = ["Worker"]
