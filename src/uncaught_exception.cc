// See uncaught_exception.h.
#include "uncaught_exception.h"

#include <c10/util/Exception.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <string>

#include "fsdp/flat_buffers.h"
#include "process_group/flight_recorder.h"

namespace datapar::detail {
namespace {

std::terminate_handler previous_handler = nullptr;

// libtorch's words for a tensor whose storage holds fewer bytes than its shape needs: what a
// parameter of a module sharded by FSDP gives when the module is called outside FSDP.
bool freed_storage_error(const std::string& what) { return what.find("out of bounds for storage of size 0") != std::string::npos; }

[[noreturn]] void on_terminate() {
  flight_recorder_on_terminate();  // where each group was, before the process goes
  const std::exception_ptr exception = std::current_exception();
  const char* abort_wanted = std::getenv("DATAPAR_ABORT_ON_UNCAUGHT");
  if (!exception || (abort_wanted != nullptr && std::strcmp(abort_wanted, "1") == 0)) {
    if (previous_handler != nullptr) previous_handler();
    std::abort();
  }
  std::string what;
  try {
    std::rethrow_exception(exception);
  } catch (const c10::Error& e) {
    what = e.what_without_backtrace();
  } catch (const std::exception& e) {
    what = e.what();
  } catch (...) {
    what = "an exception that is not a std::exception";
  }
  const char* rank = std::getenv("RANK");
  std::fprintf(stderr, "datapar: %s%s ends on an uncaught exception (exit status 1): %s\n", rank ? "rank " : "this process",
               rank ? rank : "", what.c_str());
  if (freed_storage_error(what) && fsdp_units_alive()) {
    std::fprintf(stderr,
                 "datapar: a module sharded by FullyShardedDataParallel was probably called directly: between FSDP's "
                 "forwards its parameters hold no memory. Call fsdp.forward(x) instead (for evaluation too), and read "
                 "the parameters through fsdp.full_state_dict().\n");
  }
  std::fflush(stderr);
  std::_Exit(1);
}

}  // namespace

void exit_on_uncaught_exceptions() {
  static std::once_flag once;
  std::call_once(once, [] { previous_handler = std::set_terminate(on_terminate); });
}

}  // namespace datapar::detail
