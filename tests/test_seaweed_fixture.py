import json
import urllib.request

import boto3


def test_seaweed_is_a_real_s3_server(s3_env):
    s3 = boto3.client("s3", endpoint_url=s3_env["endpoint_url"])
    s3.create_bucket(Bucket="fixture-check")
    s3.put_object(Bucket="fixture-check", Key="a/b.txt", Body=b"hello")
    assert s3.get_object(Bucket="fixture-check", Key="a/b.txt")["Body"].read() == b"hello"
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket="fixture-check")["Contents"]]
    assert keys == ["a/b.txt"]



def test_the_session_server_has_room_for_a_suites_worth_of_buckets(seaweed, s3_env):
    # weed gives each bucket a volume, and on a small disk its default volume count (free disk over
    # volume size) ran out part-way through the suite: PutObject answered InternalError. The suite
    # makes about a hundred buckets in a session; the master must have room for far more.
    s3 = boto3.client("s3", endpoint_url=s3_env["endpoint_url"])
    s3.create_bucket(Bucket="fixture-room")
    s3.put_object(Bucket="fixture-room", Key="k", Body=b"x")
    with urllib.request.urlopen(f"http://127.0.0.1:{seaweed.master_port}/dir/status", timeout=10) as r:
        topology = json.load(r)["Topology"]
    assert topology["Max"] - topology["Free"] >= 1  # the write above took a volume
    assert topology["Free"] >= 500
