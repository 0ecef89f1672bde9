"""Object storage (s3://): the checkpoint's files read where they live, with ranged reads.

vLLM's runai_streamer loader serves `s3://bucket/model` directly, and the streamer's S3 back-end
(`runai-model-streamer-s3`) is configured by environment variables: the endpoint
(`RUNAI_STREAMER_S3_ENDPOINT`, or `AWS_ENDPOINT_URL`, which vLLM copies into it), path-style
addressing (`RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING=0`) and the usual AWS credential variables.
The bench reads the same bucket with boto3 under the same variables, so what `inspect` sees is
what the server will stream: the headers with two ranged reads per shard (never a whole file),
and the small JSON files whole.

Only S3 (and S3-compatible servers) is read here; gs:// and az:// are served by the streamer's
other back-ends, which the pre-flight does not read yet (it says so, and skips).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterator, Mapping

import boto3
from botocore.config import Config as BotoConfig
from botocore.exceptions import BotoCoreError, ClientError

from bench.core.location import ObjectUri, parse_object_uri

PATTERN = "*.safetensors"


class ObjectStoreError(OSError):
    """The bucket could not be read: no endpoint answering, no such bucket or prefix, denied."""


def s3_client(env: Mapping[str, str]):
    """A boto3 S3 client configured as the streamer's S3 back-end would be by the same variables."""
    endpoint = env.get("RUNAI_STREAMER_S3_ENDPOINT") or env.get("AWS_ENDPOINT_URL") or None
    virtual = env.get("RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING", "1").strip().lower() not in ("0", "false", "no")
    session = boto3.session.Session(
        aws_access_key_id=env.get("AWS_ACCESS_KEY_ID"), aws_secret_access_key=env.get("AWS_SECRET_ACCESS_KEY"),
        aws_session_token=env.get("AWS_SESSION_TOKEN"),
        region_name=env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or "us-east-1",
    )
    config = BotoConfig(s3={"addressing_style": "virtual" if virtual else "path"}, connect_timeout=10,
                        read_timeout=120, retries={"max_attempts": 3, "mode": "standard"})
    return session.client("s3", endpoint_url=endpoint, config=config)


class ObjectFiles:
    """The files directly under an object-store prefix, listed once: names, sizes, ranged reads.
    Raises ObjectStoreError when the listing fails or finds nothing."""

    def __init__(self, uri: str, env: Mapping[str, str]):
        self.uri: ObjectUri = parse_object_uri(uri)
        self.where = str(self.uri)
        if self.uri.scheme != "s3":
            raise ObjectStoreError(f"{self.where}: only s3:// is read before the servers (the streamer serves "
                                   f"{self.uri.scheme}:// with its own back-end)")
        self.client = s3_client(env)
        self.sizes: dict[str, int] = {}
        try:
            for page in self.client.get_paginator("list_objects_v2").paginate(
                    Bucket=self.uri.bucket, Prefix=self.uri.key(""), Delimiter="/"):
                for obj in page.get("Contents", []):
                    name = obj["Key"][len(self.uri.key("")):]
                    if name:
                        self.sizes[name] = int(obj["Size"])
        except (BotoCoreError, ClientError) as exc:
            raise ObjectStoreError(f"{self.where}: cannot list: {exc}") from None
        if not self.sizes:
            raise ObjectStoreError(f"{self.where}: no objects under this prefix")

    def listing(self) -> list[str]:
        # S3 lists keys in UTF-8 byte order, and that is the order the streamer's S3 glob (and so
        # vLLM's runai_streamer loader) hands the files over in.
        return [n for n in sorted(self.sizes) if fnmatch.fnmatch(n, PATTERN)]

    def size(self, name: str) -> int:
        if name not in self.sizes:
            raise FileNotFoundError(f"{self.uri.uri(name)}: no such object")
        return self.sizes[name]

    def read(self, name: str, start: int, length: int) -> bytes:
        if length <= 0:
            return b""
        try:
            body = self.client.get_object(Bucket=self.uri.bucket, Key=self.uri.key(name),
                                          Range=f"bytes={start}-{start + length - 1}")["Body"]
            return body.read()
        except (BotoCoreError, ClientError) as exc:
            raise ObjectStoreError(f"{self.uri.uri(name)}: {exc}") from None

    def chunks(self, name: str, start: int, length: int, chunk: int) -> Iterator[bytes]:
        """The byte range as a stream of chunks: one request, read as it arrives."""
        if length <= 0:
            return
        try:
            body = self.client.get_object(Bucket=self.uri.bucket, Key=self.uri.key(name),
                                          Range=f"bytes={start}-{start + length - 1}")["Body"]
            yield from body.iter_chunks(chunk)
        except (BotoCoreError, ClientError) as exc:
            raise ObjectStoreError(f"{self.uri.uri(name)}: {exc}") from None

    def text(self, name: str) -> str | None:
        if name not in self.sizes:
            return None
        return self.read(name, 0, self.sizes[name]).decode("utf-8")
