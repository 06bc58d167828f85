// specd-draft: the draft model service (see services/draft_service/draft_worker.h).
#include "services/common/worker_main.h"
#include "services/draft_service/draft_worker.h"
#include "specd/internal/v1/draft.grpc.pb.h"

int main(int argc, char** argv) {
  namespace iv1 = specd::internal::v1;
  return specd::services::WorkerMain<specd::services::DraftWorker, iv1::Draft::CallbackService,
                                     iv1::DraftStepRequest, iv1::DraftStepResponse>(
      argc, argv, "draft", "SPECD_DRAFT");
}
