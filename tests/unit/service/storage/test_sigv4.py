"""SigV4 against the examples AWS publishes for S3 (the API reference's "Signature Calculations for the
Authorization Header" and "Authenticating Requests: Using Query Parameters", 2013-05-24, `AKIAIOSFODNN7EXAMPLE`):
the same inputs must give the same signatures, or every real store would answer `SignatureDoesNotMatch`."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from service.storage.sigv4 import Credentials, canonical_query, presign_url, sign_headers

AWS = Credentials("AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "us-east-1")
WHEN = datetime(2013, 5, 24, tzinfo=UTC)


def test_a_get_object_with_a_range_is_signed_as_in_the_aws_example() -> None:
    headers = sign_headers(
        "GET", "https://examplebucket.s3.amazonaws.com/test.txt", AWS, WHEN, headers={"Range": "bytes=0-9"}
    )
    assert headers["Authorization"] == (
        "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, "
        "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, "
        "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"
    )
    assert headers["x-amz-date"] == "20130524T000000Z"


def test_a_bucket_listing_signs_its_sorted_query_as_in_the_aws_example() -> None:
    headers = sign_headers("GET", "https://examplebucket.s3.amazonaws.com/?max-keys=2&prefix=J", AWS, WHEN)
    assert headers["Authorization"].endswith(
        "Signature=34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7"
    )


def test_a_presigned_get_matches_the_aws_example_url() -> None:
    url = presign_url("GET", "https://examplebucket.s3.amazonaws.com/test.txt", AWS, WHEN, 86400)
    assert url == (
        "https://examplebucket.s3.amazonaws.com/test.txt?X-Amz-Algorithm=AWS4-HMAC-SHA256"
        "&X-Amz-Credential=AKIAIOSFODNN7EXAMPLE%2F20130524%2Fus-east-1%2Fs3%2Faws4_request"
        "&X-Amz-Date=20130524T000000Z&X-Amz-Expires=86400&X-Amz-SignedHeaders=host"
        "&X-Amz-Signature=aeeed9bbccd4d02ee5c0109b86d86835f995330da4c265957d157751f604d404"
    )


def test_the_query_is_encoded_once_and_sorted_by_name_then_value() -> None:
    assert canonical_query([("b", "2"), ("a", "x y/z"), ("a", "1"), ("uploads", "")]) == "a=1&a=x%20y%2Fz&b=2&uploads="


@pytest.mark.parametrize("expires", [0, 7 * 24 * 3600 + 1])
def test_a_presigned_url_outside_sigv4s_bounds_is_refused(expires: int) -> None:
    with pytest.raises(ValueError, match="7 days"):
        presign_url("GET", "http://127.0.0.1:9000/bucket/key", AWS, WHEN, expires)
