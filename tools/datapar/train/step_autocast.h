// --amp bf16: autocast (datapar/amp/autocast.h) over a step's forward and loss, on every
// device type the run trains on (dp's replicas may span CPU and CUDA devices).
#pragma once

#include <algorithm>
#include <memory>
#include <vector>

#include "../train.h"
#include "datapar/amp/autocast.h"

namespace datapar::tools {

class StepAutocast {
 public:
  explicit StepAutocast(const TrainPlan& plan) {
    if (plan.options.amp == "none") return;
    const at::ScalarType dtype = plan.options.amp == "fp16" ? at::kHalf : at::kBFloat16;
    std::vector<c10::DeviceType> types;
    for (const Device& device : plan.devices) {
      const c10::DeviceType type = device.torch_device().type();
      if (std::find(types.begin(), types.end(), type) != types.end()) continue;
      types.push_back(type);
      scopes_.push_back(std::make_unique<amp::Autocast>(type, dtype));
    }
  }

 private:
  std::vector<std::unique_ptr<amp::Autocast>> scopes_;
};

}  // namespace datapar::tools
