"""Where a model lives: a local folder, a hub id, or an object-store URI. Pure.

The bench reads a model before any server (inspect, audit, load throughput), and how it reads
depends on where the model is. Object-store URIs are what vLLM's runai_streamer loader serves
directly (`vllm serve s3://bucket/model --load-format runai_streamer`); the schemes are the ones
the streamer has back-ends for (runai-model-streamer-s3, -gcs, -azure).
"""

from __future__ import annotations

from dataclasses import dataclass

OBJECT_SCHEMES = ("s3", "gs", "az")


@dataclass(frozen=True)
class ObjectUri:
    scheme: str  # s3, gs, az
    bucket: str
    prefix: str  # the model's "folder" in the bucket, without leading or trailing "/"

    def key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def uri(self, name: str = "") -> str:
        return f"{self.scheme}://{self.bucket}/{self.key(name)}" if name else str(self)

    def __str__(self) -> str:
        return f"{self.scheme}://{self.bucket}/{self.prefix}" if self.prefix else f"{self.scheme}://{self.bucket}"


def is_object_uri(path: str) -> bool:
    return path.split("://", 1)[0].lower() in OBJECT_SCHEMES and "://" in path


def parse_object_uri(path: str) -> ObjectUri:
    """s3://bucket/some/model/ -> ObjectUri("s3", "bucket", "some/model"). ValueError if it is not one."""
    scheme, sep, rest = path.partition("://")
    if not sep or scheme.lower() not in OBJECT_SCHEMES:
        raise ValueError(f"{path!r} is not an object-store URI ({', '.join(s + '://' for s in OBJECT_SCHEMES)})")
    bucket, _, prefix = rest.partition("/")
    if not bucket:
        raise ValueError(f"{path!r}: no bucket")
    return ObjectUri(scheme=scheme.lower(), bucket=bucket, prefix=prefix.strip("/"))
