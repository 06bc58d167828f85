"""Exercises the Python client against a running cluster:

    python3 test_client.py ROUTER_ADDRESS [--target ADDRESS] [--draft ADDRESS]

With --target / --draft it also checks gRPC server reflection on those workers (the router's
is always checked).
"""
import argparse

import grpc

from specd_client import SpecdClient, list_services, reflected_methods

HEALTH = "grpc.health.v1.Health"
REFLECTION = "grpc.reflection.v1alpha.ServerReflection"


def check_reflection(name, address, service, methods):
    services = list_services(address)
    for want in (service, HEALTH, REFLECTION):
        assert want in services, (name, address, want, services)
    got = reflected_methods(address, service)
    assert set(methods) <= set(got), (name, service, methods, got)
    print(f"reflection on {name}: {', '.join(services)}")


def main(address, target="", draft=""):
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

    check_reflection("router", address, "specd.v1.Generation",
                     ["Generate", "GenerateStream", "Tokenize", "GetModelInfo"])
    for name, worker in (("target", target), ("draft", draft)):
        if worker:
            check_reflection(name, worker, f"specd.internal.v1.{name.capitalize()}",
                             ["Step", "Release", "GetInfo"])
    print("python client: ok")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("router")
    ap.add_argument("--target", default="", help="target worker address: check its reflection")
    ap.add_argument("--draft", default="", help="draft worker address: check its reflection")
    a = ap.parse_args()
    main(a.router, a.target, a.draft)
