// The datapar tool's subcommands and the program that runs each. The front end, `datapar`
// (main.cc), links no libtorch: it runs `launch` itself, since a launcher only forks, waits and
// forwards output, and hands every other subcommand to `datapar-torch` (torch_main.cc), the
// program beside it that links libtorch. Loading libtorch costs 0.5-0.8 s of every start.
#pragma once

#include <string_view>

namespace datapar::tools {

inline constexpr char kTorchProgram[] = "datapar-torch";

// One-line summaries, shown by both programs' --help.
inline constexpr char kTrainSummary[] = "Train a classifier on Fashion-MNIST: one device, DataParallel or DDP";
inline constexpr char kDevicesSummary[] = "List the devices datapar can use, or check a device list";
inline constexpr char kAnalyzeSummary[] =
    "Read a job's flight recorder dumps (DATAPAR_FLIGHT_RECORDER) and say where each rank is and which differ";
inline constexpr char kBenchSummary[] = "Benchmarks: collectives, ddp";
inline constexpr char kLaunchSummary[] =
    "Run PROGRAM as the workers of a data-parallel job (torchrun's environment); see docs/launching.md";

// Whether `subcommand` needs libtorch, so runs in datapar-torch.
inline bool needs_torch(std::string_view subcommand) {
  return subcommand == "train" || subcommand == "devices" || subcommand == "bench" || subcommand == "analyze";
}

}  // namespace datapar::tools
