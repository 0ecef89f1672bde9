"""A real S3-compatible server on 127.0.0.1 for the object-storage tests: moto's server mode
(`moto_server`, installed with the bench's test extras), started and stopped by the tests.

Credentials are arbitrary for moto; the secret is long enough for bench.core.redact to mask it,
so the tests can check that it reaches no file the bench writes.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import boto3
from botocore.config import Config as BotoConfig

from .support import free_port, wait_until

MOTO = Path(sys.executable).with_name("moto_server")
ACCESS_KEY = "regbench-test-key-id"
SECRET_KEY = "regbench-test-secret-value"


class S3Server:
    def __init__(self, port: int, process: subprocess.Popen):
        self.port = port
        self.process = process
        self.endpoint = f"http://127.0.0.1:{port}"

    @property
    def env(self) -> dict[str, str]:
        """Every variable the bench, the streamer's S3 back-end and vLLM read it by."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint, "RUNAI_STREAMER_S3_ENDPOINT": self.endpoint,
            "RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING": "0", "AWS_EC2_METADATA_DISABLED": "true",
            "AWS_DEFAULT_REGION": "us-east-1", "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        }

    def client(self):
        return boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1", aws_access_key_id=ACCESS_KEY,
                            aws_secret_access_key=SECRET_KEY, config=BotoConfig(s3={"addressing_style": "path"}))

    def upload(self, folder: Path, bucket: str, prefix: str) -> str:
        """Every file of `folder` under s3://bucket/prefix/; returns that URI."""
        s3 = self.client()
        if bucket not in {b["Name"] for b in s3.list_buckets().get("Buckets", [])}:
            s3.create_bucket(Bucket=bucket)
        for f in sorted(folder.iterdir()):
            if f.is_file():
                s3.upload_file(str(f), bucket, f"{prefix}/{f.name}")
        return f"s3://{bucket}/{prefix}"

    def answers(self) -> bool:
        try:
            self.client().list_buckets()
            return True
        except Exception:
            return False


@contextmanager
def s3_server(log: Path) -> Iterator[S3Server]:
    """moto_server on a free loopback port until the block ends; fails the test if it never answers."""
    port = free_port()
    with log.open("wb") as out:
        process = subprocess.Popen([str(MOTO), "-H", "127.0.0.1", "-p", str(port)], stdout=out,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    server = S3Server(port, process)
    try:
        wait_until(server.answers, 60, f"moto_server on 127.0.0.1:{port} to answer", poll=0.2, process=process)
        yield server
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
