#include "testing/metric_sum.h"

#include <cstdlib>

namespace specd::testing {

double MetricSum(const std::string& text, const std::string& name, const std::string& label,
                 double absent) {
  double sum = 0;
  bool found = false;
  for (size_t at = 0; (at = text.find("\n" + name, at)) != std::string::npos; ++at) {
    const size_t start = at + 1 + name.size();
    if (start >= text.size() || (text[start] != ' ' && text[start] != '{')) continue;
    const size_t close = text[start] == '{' ? text.find('}', start) : start;
    if (close == std::string::npos) continue;
    if (!label.empty() && (text[start] != '{' || text.substr(start, close - start).find(label) ==
                                                     std::string::npos)) {
      continue;
    }
    const size_t sp = text.find(' ', close);
    if (sp == std::string::npos) continue;
    sum += std::strtod(text.c_str() + sp + 1, nullptr);
    found = true;
  }
  return found ? sum : absent;
}

}  // namespace specd::testing
