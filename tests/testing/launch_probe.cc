// A worker program for the `datapar launch` tests (tests/tools/launch_test.cc). It reads
// its place in the job from the launcher's environment. Modes:
//   env                       prints the launcher's variables and whether MASTER_PORT is held
//                             (a plain bind to it fails), then a last line with no newline
//   sleep DIR [ignore-term]   writes DIR/pid-RANK, then sleeps 60 s (optionally deaf to SIGTERM)
//   fail DIR RANK CODE        every rank writes DIR/pid-RANK and sleeps 60 s, except RANK,
//                             which waits until all pid files exist and exits with CODE
//                             (CODE < 0: kills itself with signal -CODE)
//   allreduce                 init_process_group("gloo") from env://, all-reduces its rank,
//                             prints "sum S over W ranks"
//   hang [BACKEND [SECONDS [RANK]]]
//                             init_process_group(BACKEND) (default or "": default_backend())
//                             with a timeout of SECONDS (3); rank RANK (default: the last)
//                             stops itself (SIGSTOP) after one all-reduce instead of a second
//                             (stall warnings after 1 s)
//                             all-reducing, the others all-reduce, time out, print the error
//                             and exit 1
//   partition DIR             init_process_group("gloo") with a 5 s timeout, one all-reduce,
//                             then DIR/ready-RANK; once DIR/partitioned exists, another
//                             all-reduce, which must fail: prints the error and exits 1
//   train DIR EPOCHS FAIL_AT  a small model trained with gradients all-reduced, a checkpoint
//                             in DIR after each epoch, resumed from the latest one at start;
//                             on the first attempt (DATAPAR_RESTART_COUNT=0) the last rank
//                             exits 3 at the start of epoch FAIL_AT (-1: never). Rank 0
//                             prints the final weights.
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>

#include <torch/torch.h>

#include "datapar/distributed.h"
#include "datapar/train/checkpoint.h"

namespace {

// Whether a socket without SO_REUSEADDR, as any other program's, fails to bind 127.0.0.1:port.
bool port_is_held(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(static_cast<uint16_t>(port));
  const bool held = ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 && errno == EADDRINUSE;
  ::close(fd);
  return held;
}

int env_int(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : -1;
}

void write_pid(const std::string& dir, int rank) {
  const std::string path = dir + "/pid-" + std::to_string(rank);
  {
    std::ofstream out(path + ".tmp");
    out << ::getpid() << "\n";
  }
  std::rename((path + ".tmp").c_str(), path.c_str());  // readers never see a half-written file
}

int train(const std::string& dir, int epochs, int fail_at) {
  using namespace datapar;
  init_process_group("gloo");
  const int rank = get_rank(), world = get_world_size();
  torch::manual_seed(0);
  torch::nn::Linear model(4, 1);
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  int first_epoch = 0;
  if (auto last = train::latest_checkpoint(dir)) {
    train::Checkpoint c = train::load_checkpoint(*last);
    train::restore_checkpoint(c, *model, sgd);
    first_epoch = static_cast<int>(c.epoch);
    std::cout << "resuming at epoch " << first_epoch << std::endl;
  }
  for (int epoch = first_epoch; epoch < epochs; ++epoch) {
    if (epoch == fail_at && rank == world - 1 && env_int("DATAPAR_RESTART_COUNT") == 0) {
      std::cout << "failing at epoch " << epoch << std::endl;
      std::_Exit(3);
    }
    // Data from the epoch alone, so a resumed run sees what the uninterrupted one saw.
    torch::manual_seed(1000 + epoch);
    const at::Tensor x = torch::randn({8 * world, 4}), y = torch::randn({8 * world, 1});
    sgd.zero_grad();
    const at::Tensor loss = torch::mse_loss(model(x.chunk(world)[rank]), y.chunk(world)[rank]);
    loss.backward();
    for (auto& p : model->parameters()) {
      default_group()->all_reduce(p.grad())->wait();
      p.grad().div_(world);
    }
    sgd.step();
    train::save_checkpoint(train::make_checkpoint(*model, sgd, epoch + 1), train::checkpoint_path(dir, epoch + 1),
                           rank);
    default_group()->barrier()->wait();  // the checkpoint exists before anyone moves on
    std::cout << "epoch " << epoch << " done" << std::endl;
  }
  if (rank == 0) {
    std::printf("final weights");
    for (auto& p : model->parameters()) {
      const at::Tensor flat = p.detach().flatten();
      for (int64_t i = 0; i < flat.numel(); ++i) std::printf(" %.9g", flat[i].item<float>());
    }
    std::printf("\n");
  }
  destroy_process_group();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  const int rank = env_int("RANK");
  if (mode == "env") {
    std::cout << "RANK=" << rank << " LOCAL_RANK=" << env_int("LOCAL_RANK") << " WORLD_SIZE=" << env_int("WORLD_SIZE")
              << " LOCAL_WORLD_SIZE=" << env_int("LOCAL_WORLD_SIZE") << " GROUP_RANK=" << env_int("GROUP_RANK")
              << " MASTER_ADDR=" << (std::getenv("MASTER_ADDR") ? std::getenv("MASTER_ADDR") : "")
              << " MASTER_PORT=" << env_int("MASTER_PORT")
              << " TOKEN=" << (std::getenv("DATAPAR_STORE_TOKEN") ? std::getenv("DATAPAR_STORE_TOKEN") : "")
              << " RUN_ID=" << (std::getenv("DATAPAR_RUN_ID") ? std::getenv("DATAPAR_RUN_ID") : "-")
              << " RESTART=" << env_int("DATAPAR_RESTART_COUNT")
              << " BACKEND=" << (std::getenv("DATAPAR_BACKEND") ? std::getenv("DATAPAR_BACKEND") : "-")
              << " MPI_WORLD=" << (std::getenv("OMPI_COMM_WORLD_SIZE") ? std::getenv("OMPI_COMM_WORLD_SIZE") : "-")
              << " MASTER_PORT_HELD=" << (port_is_held(env_int("MASTER_PORT")) ? "yes" : "no") << "\n";
    std::cerr << "to stderr from " << rank << "\n";
    std::cout << "no newline from " << rank << std::flush;
    return 0;
  }
  if (mode == "sleep" && argc >= 3) {
    if (argc > 3 && std::string(argv[3]) == "ignore-term") ::signal(SIGTERM, SIG_IGN);
    write_pid(argv[2], rank);
    std::this_thread::sleep_for(std::chrono::seconds(60));
    return 0;
  }
  if (mode == "fail" && argc == 5) {
    const std::string dir = argv[2];
    write_pid(dir, rank);
    if (rank != std::atoi(argv[3])) {
      std::this_thread::sleep_for(std::chrono::seconds(60));
      return 0;
    }
    const int world = env_int("WORLD_SIZE");
    for (int r = 0; r < world; ++r) {
      while (!std::ifstream(dir + "/pid-" + std::to_string(r))) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    std::cout << "rank " << rank << " fails now" << std::endl;
    const int code = std::atoi(argv[4]);
    if (code < 0) ::raise(-code);  // a negative CODE: die by that signal
    return code;
  }
  try {
    if (mode == "allreduce") {
      datapar::init_process_group("gloo");
      at::Tensor t = torch::full({1}, static_cast<double>(datapar::get_rank()));
      const auto work = datapar::default_group()->all_reduce(t);
      work->wait();
      std::cout << "sum " << t.item<double>() << " over " << datapar::get_world_size() << " ranks" << std::endl;
      // Several rounds of shared memory (2 MiB each), values per element and rank.
      const int64_t n = 3 << 20;
      at::Tensor big = torch::arange(n, torch::kDouble) * (datapar::get_rank() + 1);
      datapar::default_group()->all_reduce(big, datapar::ReduceOp::kAvg)->wait();
      const double ranks = datapar::get_world_size();
      // Then an odd size after the large one (the two-level path pads it and reuses its
      // scratch memory, larger than needed now).
      at::Tensor odd = torch::arange(5, torch::kDouble) * (datapar::get_rank() + 1);
      datapar::default_group()->all_reduce(odd)->wait();
      const bool exact = torch::allclose(big, torch::arange(n, torch::kDouble) * ((ranks + 1) / 2)) &&
                         torch::equal(odd, torch::arange(5, torch::kDouble) * (ranks * (ranks + 1) / 2));
      std::cout << "large all_reduce " << (exact ? "exact" : "WRONG") << " via " << work->what() << std::endl;
      datapar::destroy_process_group();
      return 0;
    }
    if (mode == "hang" && argc <= 5) {
      const int seconds = argc >= 4 ? std::atoi(argv[3]) : 3;
      datapar::init_process_group(argc >= 3 ? argv[2] : "", "env://", -1, -1, std::chrono::seconds(seconds));
      datapar::default_group()->set_stall_warning(std::chrono::seconds(1));
      const int stopping = argc >= 5 ? std::atoi(argv[4]) : datapar::get_world_size() - 1;
      at::Tensor warm = torch::ones({1});  // connections made, as in training
      datapar::default_group()->all_reduce(warm)->wait();
      if (datapar::get_rank() == stopping) {
        std::cout << "rank " << datapar::get_rank() << " hangs now" << std::endl;
        ::raise(SIGSTOP);
      }
      at::Tensor t = torch::ones({1});
      datapar::default_group()->all_reduce(t)->wait();
      return 0;
    }
    if (mode == "partition" && argc == 3) {
      const std::string dir = argv[2];
      datapar::init_process_group("gloo", "env://", -1, -1, std::chrono::seconds(5));
      at::Tensor t = torch::ones({1});
      datapar::default_group()->all_reduce(t)->wait();
      std::ofstream(dir + "/ready-" + std::to_string(rank)) << t.item<double>() << "\n";
      while (!std::ifstream(dir + "/partitioned")) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      const auto start = std::chrono::steady_clock::now();
      try {
        datapar::default_group()->all_reduce(t)->wait();
      } catch (const std::exception& e) {
        const auto waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        std::cerr << "launch_probe: after " << waited << " s: " << e.what() << "\n";
        std::_Exit(1);  // the group is broken; do not wait for peers on the way out
      }
      std::cout << "all_reduce across the partition succeeded\n";
      return 0;
    }
    if (mode == "train" && argc == 5) return train(argv[2], std::atoi(argv[3]), std::atoi(argv[4]));
  } catch (const std::exception& e) {
    std::cerr << "launch_probe: " << e.what() << "\n";
    return 1;
  }
  std::cerr << "usage: launch_probe env | sleep DIR [ignore-term] | fail DIR RANK CODE | allreduce | hang [BACKEND] | partition DIR | "
               "train DIR EPOCHS FAIL_AT\n";
  return 2;
}
