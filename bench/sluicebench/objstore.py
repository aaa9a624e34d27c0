"""The S3 emulator for object-storage strategies: where a run writes, and bringing its objects
back to local disk so the same checks read them.

bench/run starts moto's S3 server through the test kit (`sluice-testkit run --s3`), which
exports `SLUICE_TEST_S3_URL` (`s3://bucket`) and the standard `AWS_*` variables the sluice
process reads. Each run writes under a fresh prefix; after the measured command the objects
are downloaded (not timed) and deleted, so the emulator's memory does not grow run after run.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from pathlib import Path


def available() -> str | None:
    """None when the S3 emulator is there, else why not."""
    if not os.environ.get("SLUICE_TEST_S3_URL"):
        return "no S3 emulator (bench/run starts one with the test kit's --s3)"
    return None


def _client():
    import boto3  # imported here: only object-storage strategies need it

    return boto3.client(
        "s3",
        endpoint_url=os.environ["AWS_ENDPOINT_URL"],
        region_name=os.environ.get("AWS_REGION", "us-east-1"),
        aws_access_key_id=os.environ["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=os.environ["AWS_SECRET_ACCESS_KEY"],
    )


def s3_target(out: Path) -> tuple[str, Callable[[], None]]:
    """A fresh `s3://bucket/prefix` for one run, and the step that downloads it into `out`."""
    base = os.environ["SLUICE_TEST_S3_URL"].rstrip("/")
    bucket = base.removeprefix("s3://").split("/", 1)[0]
    prefix = f"bench-{uuid.uuid4().hex[:12]}"

    def fetch() -> None:
        s3 = _client()
        pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/")
        keys = [o["Key"] for page in pages for o in page.get("Contents", [])]
        for key in keys:
            local = out / key.removeprefix(prefix + "/")
            local.parent.mkdir(parents=True, exist_ok=True)
            s3.download_file(bucket, key, str(local))
        for i in range(0, len(keys), 1000):
            s3.delete_objects(
                Bucket=bucket,
                Delete={"Objects": [{"Key": k} for k in keys[i : i + 1000]]},
            )

    return f"{base}/{prefix}", fetch
