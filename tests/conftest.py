"""Session-wide test environment: dummy AWS credentials for the local S3 server."""

import os

os.environ.setdefault("AWS_ACCESS_KEY_ID", "raygen-test")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "raygen-test")
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
os.environ["AWS_EC2_METADATA_DISABLED"] = "true"
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
