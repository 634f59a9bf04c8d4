import boto3


def test_seaweed_is_a_real_s3_server(s3_env):
    s3 = boto3.client("s3", endpoint_url=s3_env["endpoint_url"])
    s3.create_bucket(Bucket="fixture-check")
    s3.put_object(Bucket="fixture-check", Key="a/b.txt", Body=b"hello")
    assert s3.get_object(Bucket="fixture-check", Key="a/b.txt")["Body"].read() == b"hello"
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket="fixture-check")["Contents"]]
    assert keys == ["a/b.txt"]
