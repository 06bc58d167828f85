// `specd client ...`: talks to a running cluster's router over gRPC.
//   specd client generate --server ADDR -p TEXT [--chat] [-n N] [--temp T] [--seed S]
//                         [--spec off|auto|draft|ngram|self] [-k K] [--stop STR]...   (streamed)
//   specd client tokenize --server ADDR -p TEXT
//   specd client health   --server ADDR
//   specd client info     --server ADDR
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/ascii.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "specd/internal/v1/draft.grpc.pb.h"
#include "specd/internal/v1/target.grpc.pb.h"
#include "specd/v1/generation.grpc.pb.h"

namespace specd {

namespace {

constexpr char kClientUsage[] =
    "usage: specd client generate|tokenize|health|info|drop-prefix-cache [--server ADDR] "
    "[options]\n"
    "  --server ADDR      router address (default $SPECD_SERVER or localhost:50051);\n"
    "                     drop-prefix-cache: a target or draft service's address (admin: "
    "evicts every cached prefix block no sequence uses)\n"
    "  -p, --prompt TEXT  prompt text\n"
    "  --chat             send the prompt as a user chat message\n"
    "  -n N               max new tokens (default 128)\n"
    "  --temp T  --top-k K  --top-p P  --seed S  --stop STR (repeatable)  --ignore-eos\n"
    "  --spec off|auto|draft|ngram|self  -k K (draft tokens per step, 0 = adaptive)\n"
    "  --timeout S        deadline in seconds (default 300)\n"
    "  --tls-ca FILE      speak TLS, verifying the server against this CA (PEM)\n"
    "  --tls-cert FILE --tls-key FILE  client certificate (mutual TLS)\n"
    "  --tls-server-name NAME  the name the server's certificate carries, when it differs\n"
    "                     from --server's host (e.g. a probe dialling localhost)\n";

// A whole (PEM) file, or exits 2 naming the flag: the client is a command-line tool.
std::string ReadPemOrExit(const char* flag, const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    std::fprintf(stderr, "specd client: %s: cannot read %s\n", flag, path.c_str());
    std::exit(2);
  }
  std::string out;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) out.append(buf, n);
  std::fclose(f);
  return out;
}

struct ClientTls {
  std::string ca, cert, key, server_name;  // file paths, and the certificate name to expect
};

// Plaintext without --tls-ca; TLS (and a client certificate with --tls-cert/--tls-key).
std::shared_ptr<grpc::Channel> MakeClientChannel(const std::string& server, const ClientTls& tls) {
  if (tls.ca.empty()) {
    if (!tls.cert.empty() || !tls.key.empty()) {
      std::fprintf(stderr, "specd client: --tls-cert/--tls-key need --tls-ca\n");
      std::exit(2);
    }
    return grpc::CreateChannel(server, grpc::InsecureChannelCredentials());
  }
  if (tls.cert.empty() != tls.key.empty()) {
    std::fprintf(stderr, "specd client: --tls-cert and --tls-key go together\n");
    std::exit(2);
  }
  grpc::SslCredentialsOptions o;
  o.pem_root_certs = ReadPemOrExit("--tls-ca", tls.ca);
  if (!tls.cert.empty()) {
    o.pem_cert_chain = ReadPemOrExit("--tls-cert", tls.cert);
    o.pem_private_key = ReadPemOrExit("--tls-key", tls.key);
  }
  grpc::ChannelArguments args;
  if (!tls.server_name.empty()) args.SetSslTargetNameOverride(tls.server_name);
  return grpc::CreateCustomChannel(server, grpc::SslCredentials(o), args);
}

int Fail(const grpc::Status& s) {
  std::fprintf(stderr, "specd client: %d %s\n", s.error_code(), s.error_message().c_str());
  return 1;
}

}  // namespace

int RunClient(int argc, char** argv) {
  if (argc < 1) {
    std::fputs(kClientUsage, stderr);
    return 2;
  }
  const std::string_view cmd = argv[0];
  const char* env = std::getenv("SPECD_SERVER");
  std::string server = env != nullptr ? env : "localhost:50051";
  std::string prompt;
  bool chat = false;
  double timeout_s = 300;
  ClientTls tls;
  specd::v1::GenerateRequest req;
  auto* s = req.mutable_sampling();
  for (int i = 1; i < argc; ++i) {
    const std::string_view f = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "specd client: %s needs a value\n", argv[i]);
        std::exit(2);
      }
      return argv[++i];
    };
    if (f == "--server") {
      server = next();
    } else if (f == "-p" || f == "--prompt") {
      prompt = next();
    } else if (f == "--chat") {
      chat = true;
    } else if (f == "-n") {
      s->set_max_new_tokens(std::atoi(next()));
    } else if (f == "--temp") {
      s->set_temperature(std::strtof(next(), nullptr));
    } else if (f == "--top-k") {
      s->set_top_k(std::atoi(next()));
    } else if (f == "--top-p") {
      s->set_top_p(std::strtof(next(), nullptr));
    } else if (f == "--seed") {
      s->set_seed(std::strtoull(next(), nullptr, 10));
    } else if (f == "--stop") {
      s->add_stop(next());
    } else if (f == "--ignore-eos") {
      s->set_ignore_eos(true);
    } else if (f == "--spec") {
      const std::string_view m = next();
      specd::v1::SpeculationMode mode;
      if (!specd::v1::SpeculationMode_Parse(absl::AsciiStrToUpper("SPECULATION_MODE_" + std::string(m)),
                                            &mode) ||
          mode == specd::v1::SPECULATION_MODE_UNSPECIFIED) {
        std::fprintf(stderr, "specd client: --spec: unknown mode '%.*s' (off, auto, draft, ngram or self)\n",
                     static_cast<int>(m.size()), m.data());
        return 2;
      }
      req.mutable_speculation()->set_mode(mode);
    } else if (f == "-k") {
      req.mutable_speculation()->set_num_draft_tokens(std::atoi(next()));
    } else if (f == "--timeout") {
      timeout_s = std::strtod(next(), nullptr);
    } else if (f == "--tls-ca") {
      tls.ca = next();
    } else if (f == "--tls-cert") {
      tls.cert = next();
    } else if (f == "--tls-key") {
      tls.key = next();
    } else if (f == "--tls-server-name") {
      tls.server_name = next();
    } else {
      std::fprintf(stderr, "specd client: unknown flag %s\n%s", argv[i], kClientUsage);
      return 2;
    }
  }
  auto channel = MakeClientChannel(server, tls);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));
  if (cmd == "health") {
    auto stub = grpc::health::v1::Health::NewStub(channel);
    grpc::health::v1::HealthCheckResponse resp;
    grpc::Status st = stub->Check(&ctx, {}, &resp);
    if (!st.ok()) return Fail(st);
    std::printf("%s\n", grpc::health::v1::HealthCheckResponse::ServingStatus_Name(resp.status()).c_str());
    return resp.status() == grpc::health::v1::HealthCheckResponse::SERVING ? 0 : 1;
  }
  if (cmd == "drop-prefix-cache") {
    // The same admin call on either model service: try the target's, then the draft's.
    specd::internal::v1::ReleaseRequest req;
    req.set_drop_prefix_cache(true);
    specd::internal::v1::ReleaseResponse resp;
    grpc::Status st = specd::internal::v1::Target::NewStub(channel)->Release(&ctx, req, &resp);
    if (st.error_code() == grpc::StatusCode::UNIMPLEMENTED) {
      grpc::ClientContext draft_ctx;
      draft_ctx.set_deadline(ctx.deadline());
      st = specd::internal::v1::Draft::NewStub(channel)->Release(&draft_ctx, req, &resp);
    }
    if (!st.ok()) return Fail(st);
    std::printf("cached blocks: %d, free blocks: %d, used blocks: %d\n", resp.kv().cached_blocks(),
                resp.kv().free_blocks(), resp.kv().used_blocks());
    return 0;
  }
  auto stub = specd::v1::Generation::NewStub(channel);
  if (cmd == "info") {
    specd::v1::ModelInfo info;
    grpc::Status st = stub->GetModelInfo(&ctx, {}, &info);
    if (!st.ok()) return Fail(st);
    std::printf("%s", info.DebugString().c_str());
    return 0;
  }
  if (cmd == "tokenize") {
    specd::v1::TokenizeRequest tr;
    tr.set_prompt(prompt);
    specd::v1::TokenizeResponse resp;
    grpc::Status st = stub->Tokenize(&ctx, tr, &resp);
    if (!st.ok()) return Fail(st);
    for (int i = 0; i < resp.token_ids_size(); ++i) {
      std::printf("%d\t%s\n", resp.token_ids(i), resp.pieces(i).c_str());
    }
    return 0;
  }
  if (cmd == "generate") {
    if (chat) {
      auto* m = req.mutable_chat()->add_messages();
      m->set_role("user");
      m->set_content(prompt);
    } else {
      req.set_prompt(prompt);
    }
    auto reader = stub->GenerateStream(&ctx, req);
    specd::v1::GenerateStreamResponse m;
    specd::v1::Completion done;
    while (reader->Read(&m)) {
      std::fputs(m.text().c_str(), stdout);
      std::fflush(stdout);
      if (m.has_completion()) done = m.completion();
    }
    std::fputs("\n", stdout);
    grpc::Status st = reader->Finish();
    if (!st.ok()) return Fail(st);
    std::fprintf(stderr,
                 "[specd] %d prompt + %d generated tokens; finish %s; ttft %.1f ms, total %.1f "
                 "ms; drafts %d/%d accepted, %.2f tokens/step\n",
                 done.usage().prompt_tokens(), done.usage().completion_tokens(),
                 specd::v1::FinishReason_Name(done.finish_reason()).c_str(),
                 done.timings().ttft_ms(), done.timings().total_ms(),
                 done.speculation().accepted_tokens(), done.speculation().draft_tokens(),
                 done.speculation().mean_accepted_length());
    return 0;
  }
  std::fprintf(stderr, "specd client: unknown command %s\n%s", argv[0], kClientUsage);
  return 2;
}

}  // namespace specd
