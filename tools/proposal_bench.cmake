# Owned by the sampling component: MakeProposal against its reference twin.
specd_tool(proposal_bench
  SRCS ${PROJECT_SOURCE_DIR}/tools/proposal_bench.cc
  DEPS specd_sampling benchmark::benchmark)
