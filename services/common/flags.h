// Service configuration from flags and environment variables: every option has a --flag and
// a SPECD_* variable; the flag wins. Deliberately tiny (no global registry).
#ifndef SPECD_SERVICES_COMMON_FLAGS_H_
#define SPECD_SERVICES_COMMON_FLAGS_H_

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/status.h"

namespace specd::services {

class FlagSet {
 public:
  explicit FlagSet(std::string program) : program_(std::move(program)) {}
  void Add(std::string flag, std::string env, std::string* target, std::string help);
  void Add(std::string flag, std::string env, int32_t* target, std::string help);
  void Add(std::string flag, std::string env, double* target, std::string help);
  void Add(std::string flag, std::string env, bool* target, std::string help);

  // Environment first, then argv (--name value or --name=value; bools may omit the value).
  // INVALID_ARGUMENT naming the flag or variable; --help prints Usage() and returns CANCELLED.
  absl::Status Parse(int argc, char** argv);
  std::string Usage() const;

 private:
  struct Flag {
    std::string flag, env, help;
    std::variant<std::string*, int32_t*, double*, bool*> target;
  };
  absl::Status Set(const Flag& f, const std::string& name, const std::string& value);

  std::string program_;
  std::vector<Flag> flags_;
};

}  // namespace specd::services

#endif  // SPECD_SERVICES_COMMON_FLAGS_H_
