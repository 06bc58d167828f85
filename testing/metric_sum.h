// Reading a Prometheus text exposition (what /metrics and services::Metrics::Text return) in
// tests.
#ifndef SPECD_TESTING_METRIC_SUM_H_
#define SPECD_TESTING_METRIC_SUM_H_

#include <string>

namespace specd::testing {

// The value of an unlabelled sample `name`, or the sum over all label sets of `name{...}`
// (`name` may carry labels itself: `specd_router_requests_total{code="OK"}`). With `label`, only
// the samples whose labels contain it (e.g. `batch="1"`). `absent` when no sample matched.
double MetricSum(const std::string& text, const std::string& name, const std::string& label = "",
                 double absent = -1);

}  // namespace specd::testing

#endif  // SPECD_TESTING_METRIC_SUM_H_
