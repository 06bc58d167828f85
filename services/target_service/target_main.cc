// specd-target: the target model service (see services/target_service/target_worker.h).
#include "services/common/worker_main.h"
#include "services/target_service/target_worker.h"
#include "specd/internal/v1/target.grpc.pb.h"

int main(int argc, char** argv) {
  namespace iv1 = specd::internal::v1;
  return specd::services::WorkerMain<specd::services::TargetWorker, iv1::Target::CallbackService,
                                     iv1::TargetStepRequest, iv1::TargetStepResponse>(
      argc, argv, "target", "SPECD_TARGET");
}
