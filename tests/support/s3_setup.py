"""Prepares a moto S3 server (started with INITIAL_NO_AUTH_ACTION_COUNT=3, so
it checks credentials after three calls) for the S3 tests: an IAM user with
an access key allowed s3:*, a bucket, and the given files as objects.

usage: s3_setup.py ENDPOINT BUCKET KEY=FILE...
prints {"access_key": ..., "secret_key": ...}
"""
import json
import sys

import boto3

endpoint, bucket, objects = sys.argv[1], sys.argv[2], sys.argv[3:]
anon = dict(endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="setup", aws_secret_access_key="setup")
iam = boto3.client("iam", **anon)
iam.create_user(UserName="apollo-test")
key = iam.create_access_key(UserName="apollo-test")["AccessKey"]
policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}
iam.put_user_policy(UserName="apollo-test", PolicyName="s3", PolicyDocument=json.dumps(policy))
s3 = boto3.client(
    "s3",
    endpoint_url=endpoint,
    region_name="us-east-1",
    aws_access_key_id=key["AccessKeyId"],
    aws_secret_access_key=key["SecretAccessKey"],
)
s3.create_bucket(Bucket=bucket)
for spec in objects:
    name, path = spec.split("=", 1)
    with open(path, "rb") as f:
        s3.put_object(Bucket=bucket, Key=name, Body=f.read())
print(json.dumps({"access_key": key["AccessKeyId"], "secret_key": key["SecretAccessKey"]}))
