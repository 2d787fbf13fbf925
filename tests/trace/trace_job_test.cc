// trace::save in a job of two processes (forked: not in the ThreadSanitizer suite, which
// includes trace_test.cc).
#include <gtest/gtest.h>
#include <chrono>
#include <string>

#include "child_process.h"
#include "datapar/distributed.h"
#include "datapar/error.h"
#include "datapar/rendezvous/store.h"
#include "datapar/trace.h"
#include "file_system.h"
#include "testing/expect_throw.h"
#include "testing/temp_dir.h"

namespace datapar {
namespace {

using namespace std::chrono_literals;

// Issue 27: a rank whose part is not trace events (a damaged store, another datapar) used to
// make rank 0 write a document no viewer opens, and exit 0. Rank 1 here is a forked process
// that puts a broken part in the job's store.
TEST(Trace, ARanksMalformedPartFailsTheSaveAndWritesNothing) {
  const testing::TempDir temp("trace_bad_part");
  const std::string init = "file://" + temp.path() + "/rendezvous";
  const pid_t pid = detail::fork_child([&] {
    init_process_group("gloo", init, 1, 2, 30s);
    Store& store = *default_store();
    store.set("datapar/trace/1/0", R"({"name":"x","ph":"X","ts":)");
    store.set("datapar/trace/1", "1");
    (void)store.get_string("test/done");  // rank 0 has read it
    return 0;
  });
  init_process_group("gloo", init, 0, 2, 30s);
  trace::start();
  { const trace::Span span("optimizer step", "step"); }
  const std::string path = temp.path() + "/run.json";
  EXPECT_THROW_MSG(trace::save(path), Error, "rank 1's trace events are not JSON");
  EXPECT_FALSE(detail::exists(path));
  default_store()->set("test/done", "1");
  EXPECT_EQ(detail::wait_child(pid, std::chrono::steady_clock::now() + 60s).exit_code, 0);
  destroy_process_group();
}

}  // namespace
}  // namespace datapar
