"""Object storage for the service: an S3-compatible client (`S3Client`) and the SigV4 signing it uses.

- `sigv4.py`: AWS Signature Version 4, pure (signed headers, presigned URLs), pinned to AWS's published examples;
- `s3.py`: `S3Client`, the calls recordings need (put, multipart, list, delete, presign) over httpx.
"""

from __future__ import annotations

from service.storage.s3 import ObjectStoreConfig, ObjectStoreError, S3Client, StoredObject
from service.storage.sigv4 import Credentials

__all__ = ["Credentials", "ObjectStoreConfig", "ObjectStoreError", "S3Client", "StoredObject"]
