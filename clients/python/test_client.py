"""Exercises the Python client against a running cluster: python3 test_client.py ADDRESS."""
import sys

import grpc

from specd_client import SpecdClient


def main(address):
    c = SpecdClient(address, timeout=120)
    assert c.healthy(), "router not SERVING"
    info = c.model_info()
    assert info.vocab_size > 0, info
    ids = c.tokenize("hello world")
    assert ids, "tokenize returned nothing"

    kw = dict(max_new_tokens=24, temperature=0.7, seed=5, ignore_eos=True)
    unary = c.generate("The quick brown fox", **kw)
    streamed = "".join(c.stream("The quick brown fox", **kw))
    assert unary.text == streamed, (unary.text, streamed)
    assert unary.completion.usage.completion_tokens == 24, unary.completion
    by_ids = c.generate(token_ids=[5, 6, 7, 8], max_new_tokens=4, temperature=0,
                        speculation="draft", num_draft_tokens=2, ignore_eos=True)
    assert len(by_ids.token_ids) == 4, by_ids

    try:
        c.generate("hi", max_new_tokens=0)
        raise AssertionError("max_new_tokens=0 was accepted")
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, e
        assert "sampling.max_new_tokens" in e.details(), e.details()
    try:
        c.generate(b"\xff\xfe bad", max_new_tokens=4)
        raise AssertionError("invalid UTF-8 was accepted")
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, e
        assert e.details().startswith("prompt"), e.details()
    print("python client: ok")


if __name__ == "__main__":
    main(sys.argv[1])
