"""An S3-compatible store (AWS S3, MinIO, R2, GCS's interoperability endpoint) for files over what
Redis holds, when one is configured (``GPULAYER_S3_BUCKET``): the submitter's side, which alone holds
its credentials (boto3's own: its environment variables, its files). It uploads a job's big inputs
itself and hands workers presigned URLs: one to GET the inputs, one to PUT the outputs and one to GET
them, each made at submit and valid for the jobs' retention (at most the 7 days a presigned URL may
live). Workers use plain HTTP (:mod:`gpulayer.presigned`) and hold no storage credentials.

Objects are named ``<prefix>/<job id>/<archive>``, under the installation's prefix.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from .errors import ConfigError
from .settings import Settings

#: The longest a presigned URL (SigV4) may be valid (s).
LONGEST = 7 * 86400


@dataclasses.dataclass(frozen=True)
class Urls:
    """Where one archive of a job is put (None: it is put by the submitter) and read."""

    put: str | None
    get: str


class ObjectStore:
    """The configured store, through a boto3 client made with ``settings``."""

    def __init__(self, settings: Settings) -> None:
        try:
            import boto3
            from botocore.config import Config
        except ImportError:
            raise ConfigError(
                "GPULAYER_S3_BUCKET is set, and this machine lacks boto3: pip install 'gpulayer[s3]'"
            ) from None
        self._s3: Any = boto3.client(
            "s3",
            endpoint_url=settings.s3_endpoint_url,
            region_name=settings.s3_region,
            config=Config(signature_version="s3v4"),
        )
        self._bucket = settings.s3_bucket
        self._prefix = settings.prefix
        self._expiry = min(settings.retention_seconds, LONGEST)

    @classmethod
    def configured(cls, settings: Settings) -> ObjectStore | None:
        return cls(settings) if settings.s3_bucket else None

    def _key(self, job_id: str, name: str) -> str:
        return f"{self._prefix}/{job_id}/{name}"

    def _url(self, method: str, key: str) -> str:
        params = {"Bucket": self._bucket, "Key": key}
        return str(self._s3.generate_presigned_url(method, Params=params, ExpiresIn=self._expiry))

    def upload(self, job_id: str, name: str, path: Path) -> Urls:
        """Archive ``name`` of job ``job_id``, the file at ``path``, put in the store: where it is read."""
        key = self._key(job_id, name)
        self._s3.upload_file(str(path), self._bucket, key)
        return Urls(None, self._url("get_object", key))

    def presign(self, job_id: str, name: str) -> Urls:
        """Where archive ``name`` of job ``job_id`` is to be put, and read."""
        key = self._key(job_id, name)
        return Urls(self._url("put_object", key), self._url("get_object", key))
