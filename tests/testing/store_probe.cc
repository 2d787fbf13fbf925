// A process of a test job: joins the rendezvous at argv[1] as rank argv[2] of argv[3],
// swaps a value with every other rank through the store, and exits 0 if all went well.
// Used by tests that need real processes, e.g. across network namespaces.
#include <iostream>
#include <string>

#include "datapar/error.h"
#include "datapar/rendezvous/init_method.h"

int main(int argc, char** argv) {
  if (argc != 4) {
    std::cerr << "usage: store_probe INIT_METHOD RANK WORLD_SIZE\n";
    return 2;
  }
  try {
    const int rank = std::stoi(argv[2]);
    const int world_size = std::stoi(argv[3]);
    datapar::Rendezvous rdzv = datapar::rendezvous(argv[1], rank, world_size, std::chrono::seconds(30));
    rdzv.store->set("probe/" + std::to_string(rank), "hello from " + std::to_string(rank));
    for (int r = 0; r < world_size; ++r) {
      if (rdzv.store->get_string("probe/" + std::to_string(r)) != "hello from " + std::to_string(r)) return 3;
    }
    // Rank 0 hosts the server: it leaves last, once everyone has read.
    if (rdzv.store->add("probe/done", 1) == world_size) rdzv.store->set("probe/all_done", "1");
    if (rank == 0) rdzv.store->wait({"probe/all_done"});
    std::cout << "store_probe: rank " << rank << " of " << world_size << " ok\n";
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "store_probe: " << e.what() << "\n";
    return 1;
  }
}
