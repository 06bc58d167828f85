"""Python client for a specd cluster (the public specd.v1.Generation API).

The gRPC stubs are generated from ../../proto at first use (grpcio-tools), so the client always
matches the protos in the tree:

    from specd_client import SpecdClient
    c = SpecdClient("localhost:50051")
    print(c.generate("Hello", max_new_tokens=32, temperature=0).text)
    for piece in c.stream("Hello", max_new_tokens=32):
        print(piece, end="", flush=True)
"""
import importlib
import os
import sys
import tempfile

import grpc

_PROTO_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "proto")
_stubs = None


def load_stubs(out_dir=None):
    """Generates (once) and imports the Python stubs; returns a namespace of modules."""
    global _stubs
    if _stubs is not None:
        return _stubs
    from grpc_tools import protoc  # grpcio-tools

    out_dir = out_dir or tempfile.mkdtemp(prefix="specd_py_stubs_")
    # health.proto lives under grpc/ in proto/, but a Python package named "grpc" would shadow
    # grpcio itself: generate it as specd_health/health.proto (same wire names).
    src = os.path.join(out_dir, "src")
    os.makedirs(os.path.join(src, "specd_health"), exist_ok=True)
    with open(os.path.join(_PROTO_DIR, "grpc", "health", "v1", "health.proto")) as f:
        health = f.read()
    with open(os.path.join(src, "specd_health", "health.proto"), "w") as f:
        f.write(health)
    for inc, proto in ((_PROTO_DIR, "specd/v1/generation.proto"), (src, "specd_health/health.proto")):
        args = ["protoc", f"-I{inc}", f"--python_out={out_dir}", f"--grpc_python_out={out_dir}", proto]
        if protoc.main(args) != 0:
            raise RuntimeError("protoc failed on " + proto)
    sys.path.insert(0, out_dir)

    class Stubs:
        pb = importlib.import_module("specd.v1.generation_pb2")
        grpc = importlib.import_module("specd.v1.generation_pb2_grpc")
        health_pb = importlib.import_module("specd_health.health_pb2")
        health_grpc = importlib.import_module("specd_health.health_pb2_grpc")

    _stubs = Stubs
    return _stubs


_MODES = {"off": 1, "auto": 2, "draft": 3, "ngram": 4, "self": 5}


class SpecdClient:
    def __init__(self, address, timeout=300.0):
        self.s = load_stubs()
        self.channel = grpc.insecure_channel(address)
        self.stub = self.s.grpc.GenerationStub(self.channel)
        self.health_stub = self.s.health_grpc.HealthStub(self.channel)
        self.timeout = timeout

    def request(self, prompt=None, token_ids=None, chat=None, speculation="auto",
                num_draft_tokens=0, stop=(), **sampling):
        pb = self.s.pb
        r = pb.GenerateRequest()
        if token_ids is not None:
            r.tokens.ids.extend(token_ids)
        elif chat is not None:
            for role, content in chat:
                m = r.chat.messages.add()
                m.role = role
                m.content = content.encode() if isinstance(content, str) else content
        else:
            r.prompt = prompt.encode() if isinstance(prompt, str) else prompt
        for k, v in sampling.items():
            setattr(r.sampling, k, v)
        for s in stop:
            r.sampling.stop.append(s.encode())
        r.speculation.mode = _MODES[speculation]
        r.speculation.num_draft_tokens = num_draft_tokens
        return r

    def generate(self, prompt=None, **kw):
        return self.stub.Generate(self.request(prompt, **kw), timeout=self.timeout)

    def stream_responses(self, prompt=None, **kw):
        return self.stub.GenerateStream(self.request(prompt, **kw), timeout=self.timeout)

    def stream(self, prompt=None, **kw):
        for m in self.stream_responses(prompt, **kw):
            if m.text:
                yield m.text

    def tokenize(self, prompt):
        r = self.s.pb.TokenizeRequest(prompt=prompt.encode())
        return list(self.stub.Tokenize(r, timeout=self.timeout).token_ids)

    def model_info(self):
        return self.stub.GetModelInfo(self.s.pb.GetModelInfoRequest(), timeout=self.timeout)

    def healthy(self):
        resp = self.health_stub.Check(self.s.health_pb.HealthCheckRequest(), timeout=5)
        return resp.status == self.s.health_pb.HealthCheckResponse.SERVING


def list_services(address, timeout=10.0):
    """Service names that `address` lists through gRPC server reflection (grpcio-reflection)."""
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
        ProtoReflectionDescriptorDatabase)

    with grpc.insecure_channel(address) as channel:
        grpc.channel_ready_future(channel).result(timeout=timeout)
        return sorted(ProtoReflectionDescriptorDatabase(channel).get_services())


def reflected_methods(address, service, timeout=10.0):
    """Method names of `service`, from the descriptors `address` serves through reflection."""
    from google.protobuf.descriptor_pool import DescriptorPool
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
        ProtoReflectionDescriptorDatabase)

    with grpc.insecure_channel(address) as channel:
        grpc.channel_ready_future(channel).result(timeout=timeout)
        pool = DescriptorPool(ProtoReflectionDescriptorDatabase(channel))
        return sorted(m.name for m in pool.FindServiceByName(service).methods)
