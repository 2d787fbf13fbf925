// Collects the warnings datapar gives (datapar/warning.h) while it lives, from any thread.
#pragma once

#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "datapar/warning.h"

namespace datapar::testing {

class CapturedWarnings {
 public:
  CapturedWarnings() {
    previous_ = set_warning_sink([this](const std::string& message) {
      std::lock_guard<std::mutex> lock(mutex_);
      messages_.push_back(message);
    });
  }
  ~CapturedWarnings() { set_warning_sink(previous_); }
  CapturedWarnings(const CapturedWarnings&) = delete;
  CapturedWarnings& operator=(const CapturedWarnings&) = delete;

  std::vector<std::string> messages() {
    std::lock_guard<std::mutex> lock(mutex_);
    return messages_;
  }
  // Waits up to `limit` for `count` warnings.
  std::vector<std::string> wait_for(size_t count, std::chrono::milliseconds limit) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (messages().size() < count && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return messages();
  }

 private:
  WarningSink previous_;
  std::mutex mutex_;
  std::vector<std::string> messages_;
};

}  // namespace datapar::testing
