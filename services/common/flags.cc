#include "services/common/flags.h"

#include <cstdio>
#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace specd::services {

void FlagSet::Add(std::string flag, std::string env, std::string* t, std::string help) {
  flags_.push_back({std::move(flag), std::move(env), std::move(help), t});
}
void FlagSet::Add(std::string flag, std::string env, int32_t* t, std::string help) {
  flags_.push_back({std::move(flag), std::move(env), std::move(help), t});
}
void FlagSet::Add(std::string flag, std::string env, double* t, std::string help) {
  flags_.push_back({std::move(flag), std::move(env), std::move(help), t});
}
void FlagSet::Add(std::string flag, std::string env, bool* t, std::string help) {
  flags_.push_back({std::move(flag), std::move(env), std::move(help), t});
}

absl::Status FlagSet::Set(const Flag& f, const std::string& name, const std::string& v) {
  bool ok = true;
  if (auto* s = std::get_if<std::string*>(&f.target)) {
    **s = v;
  } else if (auto* i = std::get_if<int32_t*>(&f.target)) {
    ok = absl::SimpleAtoi(v, *i);
  } else if (auto* d = std::get_if<double*>(&f.target)) {
    ok = absl::SimpleAtod(v, *d);
  } else if (auto* b = std::get_if<bool*>(&f.target)) {
    ok = absl::SimpleAtob(v, *b);
  }
  if (!ok) return absl::InvalidArgumentError(absl::StrCat(name, ": invalid value \"", v, "\""));
  return absl::OkStatus();
}

absl::Status FlagSet::Parse(int argc, char** argv) {
  for (const Flag& f : flags_) {
    if (const char* e = std::getenv(f.env.c_str()); e != nullptr && *e != '\0') {
      if (absl::Status s = Set(f, f.env, e); !s.ok()) return s;
    }
  }
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::fputs(Usage().c_str(), stdout);
      return absl::CancelledError("help");
    }
    std::string value;
    bool has_value = false;
    if (const size_t eq = arg.find('='); eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
      has_value = true;
    }
    const Flag* found = nullptr;
    for (const Flag& f : flags_) {
      if (arg == "--" + f.flag) found = &f;
    }
    if (found == nullptr) return absl::InvalidArgumentError(absl::StrCat("unknown flag ", arg));
    if (!has_value) {
      if (std::holds_alternative<bool*>(found->target) &&
          (i + 1 >= argc || std::string(argv[i + 1]).rfind("--", 0) == 0)) {
        value = "true";
      } else if (i + 1 < argc) {
        value = argv[++i];
      } else {
        return absl::InvalidArgumentError(absl::StrCat(arg, ": missing value"));
      }
    }
    if (absl::Status s = Set(*found, arg, value); !s.ok()) return s;
  }
  return absl::OkStatus();
}

std::string FlagSet::Usage() const {
  std::string out = absl::StrCat("usage: ", program_, " [flags]\n");
  for (const Flag& f : flags_) {
    std::string def;
    if (auto* s = std::get_if<std::string*>(&f.target)) def = **s;
    if (auto* i = std::get_if<int32_t*>(&f.target)) def = absl::StrCat(**i);
    if (auto* d = std::get_if<double*>(&f.target)) def = absl::StrCat(**d);
    if (auto* b = std::get_if<bool*>(&f.target)) def = **b ? "true" : "false";
    absl::StrAppend(&out, "  --", f.flag, " (", f.env, ", default \"", def, "\")\n      ", f.help,
                    "\n");
  }
  return out;
}

}  // namespace specd::services
