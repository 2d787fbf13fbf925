// Fuzz target: loading a checkpoint file and restoring it into a model and its optimizer.
// The first byte picks what the rest is:
//   even: a whole file (zip layer, CRCs, records, pickle, checkpoint layout);
//   odd:  u8 n, n u16 record sizes, then a data.pkl that this target wraps into a valid
//         archive with records data/0 .. data/n-1 of those sizes (patterned bytes), so the
//         mutations reach the checkpoint's structure checks and restore behind the CRCs.
// Any input must restore or end in a datapar::Error; anything else is a finding.
#include <ATen/ATen.h>
#include <caffe2/serialize/inline_container.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <cstdint>
#include <string>

#include "datapar/error.h"
#include "datapar/train/checkpoint.h"
#include "memory_file.h"

namespace {

std::string wrap(const uint8_t* data, size_t size) {
  if (size < 1) return {};
  const size_t records = data[0] % 8;
  if (size < 1 + 2 * records) return {};
  std::string archive;
  caffe2::serialize::PyTorchStreamWriter writer([&archive](const void* bytes, size_t n) {
    archive.append(static_cast<const char*>(bytes), n);
    return n;
  });
  const uint8_t* pickle = data + 1 + 2 * records;
  writer.writeRecord("data.pkl", pickle, size - (pickle - data));
  writer.writeRecord("byteorder", "little", 6);
  for (size_t i = 0; i < records; ++i) {
    const size_t bytes = data[1 + 2 * i] | (size_t{data[2 + 2 * i]} << 8);
    std::string content(bytes, '\0');
    for (size_t b = 0; b < bytes; ++b) content[b] = static_cast<char>(b * 37 + i);
    writer.writeRecord("data/" + std::to_string(i), content.data(), content.size());
  }
  writer.writeEndOfFile();
  return archive;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  static datapar::fuzz::MemoryFile file;
  std::string path;
  if (data[0] & 1) {
    const std::string archive = wrap(data + 1, size - 1);
    if (archive.empty()) return 0;
    path = file.hold(archive.data(), archive.size());
  } else {
    path = file.hold(data + 1, size - 1);
  }
  // One model for every run: a restore replaces all of its state, or (refused) none of it.
  static torch::nn::Linear model(3, 2);
  static torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  try {
    const datapar::train::Checkpoint c = datapar::train::load_checkpoint(path, at::kCPU);
    datapar::train::restore_checkpoint(c, *model, optimizer, /*restore_rng=*/false);
  } catch (const datapar::Error&) {
  }
  return 0;
}
